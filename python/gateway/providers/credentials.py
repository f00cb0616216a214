"""Bearer tokens: from Entra ID for Azure OpenAI (a service principal's client secret, a workload
identity's federated token, or a managed identity), and from Google's sign-in (Vertex AI) through
google-auth.

A token is fetched on first use, kept per process, and fetched again once less than
REFRESH_BEFORE_SECONDS of its life is left (or a tenth of it, for short-lived tokens), so a request
never carries a token about to expire. Concurrent requests wait for one fetch, not one each. A
token endpoint that refuses or cannot be reached is the channel's failure (provider_error): the
request moves to another channel, as for any upstream that turns the gateway away.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import orjson

from ..config import ClientCredentials
from ..errors import GatewayError
from .http import UPSTREAM_FAILURES, UpstreamClient, UpstreamResponse

REFRESH_BEFORE_SECONDS = 300.0
TOKEN_TIMEOUT_SECONDS = 10.0
CLIENT_ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"


@dataclass(slots=True)
class _Token:
    value: str
    refresh_at: float  # time.monotonic() after which it is fetched again


class TokenCache:
    def __init__(self) -> None:
        self._tokens: dict[ClientCredentials, _Token] = {}
        self._locks: dict[ClientCredentials, asyncio.Lock] = {}

    async def bearer(self, credentials: ClientCredentials, upstream: UpstreamClient) -> str:
        """A token good for a while yet."""
        token = self._tokens.get(credentials)
        if token is not None and time.monotonic() < token.refresh_at:
            return token.value
        lock = self._locks.setdefault(credentials, asyncio.Lock())
        async with lock:
            token = self._tokens.get(credentials)  # another request may have fetched it meanwhile
            if token is None or time.monotonic() >= token.refresh_at:
                token = await _fetch(credentials, upstream)
                self._tokens[credentials] = token
            return token.value


async def _fetch(credentials: ClientCredentials, upstream: UpstreamClient) -> _Token:
    started = time.monotonic()
    try:
        async with asyncio.timeout(TOKEN_TIMEOUT_SECONDS):
            response = await _token_request(credentials, upstream)
            try:
                status, body = response.status, await response.read()
            finally:
                response.release()
    except (TimeoutError, *UPSTREAM_FAILURES) as exc:
        raise _refused("its token endpoint could not be reached") from exc
    if status != 200:
        raise _refused(f"its token endpoint answered HTTP {status}")
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        answer = None
    if not isinstance(answer, dict):
        answer = {}
    value = answer.get("access_token")
    lifetime = _seconds(answer.get("expires_in"))
    if lifetime is None:  # App Service's identity endpoint says only when it expires
        expires_on = _seconds(answer.get("expires_on"))
        lifetime = None if expires_on is None else int(expires_on - time.time())
    if not isinstance(value, str) or not value or lifetime is None or lifetime <= 0:
        raise _refused("its token endpoint sent no usable token")
    margin = min(REFRESH_BEFORE_SECONDS, lifetime / 10)
    return _Token(value, started + lifetime - margin)


async def _token_request(credentials: ClientCredentials, upstream: UpstreamClient) -> UpstreamResponse:
    """The token request of the credentials' kind: a form POST to Entra ID with the client's
    secret or its federated token (read afresh each time: Kubernetes rotates the file), or a GET
    of the managed identity endpoint."""
    if credentials.kind == "managed_identity":
        return await _managed_identity_request(credentials, upstream)
    form = {
        "grant_type": "client_credentials",
        "client_id": credentials.client_id or "",
        "scope": credentials.scope,
    }
    if credentials.kind == "workload_identity":
        assert credentials.federated_token_file is not None, "config requires it"
        try:
            with open(credentials.federated_token_file, encoding="utf-8") as f:
                assertion = f.read().strip()
        except OSError as exc:
            raise _refused("its federated token file could not be read") from exc
        if not assertion:
            raise _refused("its federated token file is empty")
        form["client_assertion_type"] = CLIENT_ASSERTION_TYPE
        form["client_assertion"] = assertion
    else:
        secret = credentials.client_secret()
        if secret is None:
            raise _refused(f"its client secret ({credentials.client_secret_env}) is not set")
        form["client_secret"] = secret
    headers = {"content-type": "application/x-www-form-urlencoded", "accept": "application/json"}
    return await upstream.post(
        credentials.token_url, urlencode(form).encode(), headers, TOKEN_TIMEOUT_SECONDS
    )


async def _managed_identity_request(
    credentials: ClientCredentials, upstream: UpstreamClient
) -> UpstreamResponse:
    """IMDS (a VM, AKS nodes, Arc): `Metadata: true`, api-version 2018-02-01. App Service and its
    kin: the secret header their platform puts in IDENTITY_HEADER, api-version 2019-08-01."""
    query = {"resource": credentials.scope.removesuffix("/.default")}
    if credentials.identity_header_env is not None:
        secret = os.environ.get(credentials.identity_header_env)
        if not secret:
            raise _refused(f"its identity header ({credentials.identity_header_env}) is not set")
        headers = {"x-identity-header": secret}
        query["api-version"] = "2019-08-01"
    else:
        headers = {"metadata": "true"}
        query["api-version"] = "2018-02-01"
    if credentials.client_id:
        query["client_id"] = credentials.client_id
    separator = "&" if "?" in credentials.token_url else "?"
    return await upstream.get(
        credentials.token_url + separator + urlencode(query), TOKEN_TIMEOUT_SECONDS, headers
    )


def _seconds(value: Any) -> int | None:
    """A count of seconds as Entra's endpoints write it: a number, or digits in a string."""
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _refused(why: str) -> GatewayError:
    # Credentials are never part of the message.
    return GatewayError(
        "provider_error", f"The gateway could not sign in to the model's provider: {why}.", retry="other"
    )


# One per process: tokens are shared by every request of the worker.
TOKENS = TokenCache()

GOOGLE_SCOPE = "https://www.googleapis.com/auth/cloud-platform"


class GoogleTokens:
    """Google access tokens for Vertex AI, by google-auth: a service account's key file, or the
    application default credentials (GOOGLE_APPLICATION_CREDENTIALS, gcloud's, the metadata
    server's). google-auth holds each token and counts it invalid a few minutes before it expires;
    it is then fetched again, once for all waiting requests, off the event loop."""

    def __init__(self) -> None:
        self._credentials: dict[str | None, Any] = {}
        self._locks: dict[str | None, asyncio.Lock] = {}

    async def bearer(self, key_file: str | None) -> str:
        credentials = self._credentials.get(key_file)
        if credentials is not None and credentials.valid:
            return str(credentials.token)
        async with self._locks.setdefault(key_file, asyncio.Lock()):
            held: Any = self._credentials.get(key_file)
            if held is None or not held.valid:
                held = await asyncio.to_thread(_google_refreshed, held, key_file)
                self._credentials[key_file] = held
            return str(held.token)


def _google_refreshed(credentials: Any, key_file: str | None) -> Any:
    """Blocking (google-auth's transport is requests): the credentials with a fresh token."""
    import google.auth
    import google.auth.exceptions
    import google.auth.transport.requests
    from google.oauth2 import service_account

    try:
        if credentials is None:
            if key_file is not None:
                credentials = service_account.Credentials.from_service_account_file(  # type: ignore[no-untyped-call]
                    key_file, scopes=[GOOGLE_SCOPE]
                )
            else:
                credentials, _ = google.auth.default(scopes=[GOOGLE_SCOPE])
        credentials.refresh(google.auth.transport.requests.Request())
    except (OSError, ValueError, google.auth.exceptions.GoogleAuthError) as exc:
        raise _refused(f"Google sign-in failed ({type(exc).__name__})") from exc
    return credentials


GOOGLE_TOKENS = GoogleTokens()

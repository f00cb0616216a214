"""Bearer tokens: from OAuth 2.0 client credentials (Entra ID service principals, for Azure
OpenAI), and from Google's sign-in (Vertex AI) through google-auth.

A token is fetched on first use, kept per process, and fetched again once less than
REFRESH_BEFORE_SECONDS of its life is left (or a tenth of it, for short-lived tokens), so a request
never carries a token about to expire. Concurrent requests wait for one fetch, not one each. A
token endpoint that refuses or cannot be reached is the channel's failure (provider_error): the
request moves to another channel, as for any upstream that turns the gateway away.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import orjson

from ..config import ClientCredentials
from ..errors import GatewayError
from .http import UPSTREAM_FAILURES, UpstreamClient

REFRESH_BEFORE_SECONDS = 300.0
TOKEN_TIMEOUT_SECONDS = 10.0


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
    secret = credentials.client_secret()
    if secret is None:
        raise _refused(f"its client secret ({credentials.client_secret_env}) is not set")
    form = urlencode(
        {
            "grant_type": "client_credentials",
            "client_id": credentials.client_id,
            "client_secret": secret,
            "scope": credentials.scope,
        }
    ).encode()
    headers = {"content-type": "application/x-www-form-urlencoded", "accept": "application/json"}
    started = time.monotonic()
    try:
        async with asyncio.timeout(TOKEN_TIMEOUT_SECONDS):
            response = await upstream.post(credentials.token_url, form, headers, TOKEN_TIMEOUT_SECONDS)
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
    value = answer.get("access_token") if isinstance(answer, dict) else None
    lifetime = answer.get("expires_in") if isinstance(answer, dict) else None
    if isinstance(lifetime, str) and lifetime.isdigit():  # Entra's v1 endpoint sends it as a string
        lifetime = int(lifetime)
    if not isinstance(value, str) or not value or not isinstance(lifetime, int) or lifetime <= 0:
        raise _refused("its token endpoint sent no usable token")
    margin = min(REFRESH_BEFORE_SECONDS, lifetime / 10)
    return _Token(value, started + lifetime - margin)


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

"""Azure OpenAI: OpenAI's API behind Azure's URLs, sign-in and content filter, and Entra ID's token
endpoint.

  POST /openai/deployments/{deployment}/{operation}?api-version=...   (the deployment style)
  POST /openai/v1/{operation}                                         (the v1 API)
  POST /{tenant}/oauth2/v2.0/token                                    (Entra ID, client credentials:
                                                                      a secret or a federated token)
  GET  /metadata/identity/oauth2/token                                (a managed identity: IMDS)
  GET  /msi/token                                                     (a managed identity: App Service)

A request signs in with an `api-key` header (any non-empty key) or a bearer token this simulator
issued; without either it is refused 401 as Azure refuses it, and a deployment URL without
`api-version` is 404 "Resource not found". The operations are OpenAI's (sim/chat.py and the
others); chat answers carry Azure's content filter results, `fail=content_policy` is Azure's 400
`content_filter` refusal and `filter_after=N` its cut of an answer (finish_reason content_filter).
Each request is recorded as `{"path": "/openai/...", "deployment", "api_version", "auth"}` before
the operation records its own entry.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING
from urllib.parse import parse_qs

import orjson
from aiohttp import web

from . import chat, embeddings, images, responses, speech, transcription
from .wire import reply

if TYPE_CHECKING:
    from .state import Simulator

Operation = Callable[["Simulator", web.Request], Awaitable[web.StreamResponse]]

OPERATIONS: dict[str, Operation] = {
    "chat/completions": lambda sim, request: chat.create(sim, request, azure=True),
    "embeddings": embeddings.create,
    "responses": responses.create,
    "images/generations": images.generate,
    "images/edits": images.edit,
    "audio/speech": speech.create,
    "audio/transcriptions": transcription.create,
}
OPERATION = "{operation:" + "|".join(OPERATIONS) + "}"
TOKEN_LIFETIME = 3599  # seconds, as Entra ID issues them
SCOPE = "https://cognitiveservices.azure.com/.default"
CLIENT_ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
_UNAUTHORIZED = orjson.dumps(
    {
        "error": {
            "code": "401",
            "message": "Access denied due to invalid subscription key or wrong API endpoint. Make sure to "
            "provide a valid key for an active subscription and use a correct regional API endpoint for "
            "your resource.",
        }
    }
)
_NOT_FOUND = orjson.dumps({"error": {"code": "404", "message": "Resource not found"}})


async def deployment(sim: Simulator, request: web.Request) -> web.StreamResponse:
    """An operation on a deployment: the API version is required."""
    version = request.query.get("api-version")
    if not version:
        return reply(404, _NOT_FOUND)
    return await _operation(sim, request, request.match_info["deployment"], version)


async def v1(sim: Simulator, request: web.Request) -> web.StreamResponse:
    """An operation of the v1 API: the body's model names the deployment."""
    return await _operation(sim, request, None, request.query.get("api-version"))


async def _operation(
    sim: Simulator, request: web.Request, deployment: str | None, version: str | None
) -> web.StreamResponse:
    auth = _signed_in(sim, request)
    if auth is None:
        return reply(401, _UNAUTHORIZED)
    operation = request.match_info["operation"]
    sim.record(
        {"path": request.path, "deployment": deployment, "api_version": version, "auth": auth, "body": {}}
    )
    return await OPERATIONS[operation](sim, request)


def _signed_in(sim: Simulator, request: web.Request) -> str | None:
    """How the request signed in ("api-key" or "entra"), or None."""
    if request.headers.get("api-key"):
        return "api-key"
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token in sim.entra_tokens:
        return "entra"
    return None


async def token(sim: Simulator, request: web.Request) -> web.StreamResponse:
    """Entra ID's token endpoint for client credentials: a service principal's secret, or a
    federated token as the client assertion (a workload identity). The assertion must be a JWT;
    its signature is not checked (that needs the issuer's keys)."""
    form = {k: v[-1] for k, v in parse_qs((await request.read()).decode(errors="replace")).items()}
    sim.record(
        {
            "path": "/oauth2/v2.0/token",
            "tenant": request.match_info["tenant"],
            "body": {k: v for k, v in form.items() if k not in ("client_secret", "client_assertion")},
            "assertion": form.get("client_assertion"),
        }
    )
    if form.get("grant_type") != "client_credentials":
        return _entra_error(
            400, "unsupported_grant_type", "AADSTS70003: The app requested an unsupported grant type."
        )
    if form.get("client_assertion_type") == CLIENT_ASSERTION_TYPE:
        if form.get("client_assertion", "").count(".") != 2 or not form.get("client_id"):
            return _entra_error(400, "invalid_client", "AADSTS50027: JWT token is invalid or malformed.")
    elif not form.get("client_id") or not form.get("client_secret"):
        return _entra_error(401, "invalid_client", "AADSTS7000215: Invalid client secret provided.")
    if form.get("scope") != SCOPE:
        return _entra_error(400, "invalid_scope", "AADSTS1002012: The provided value for scope is not valid.")
    answer = {
        "token_type": "Bearer",
        "expires_in": TOKEN_LIFETIME,
        "ext_expires_in": TOKEN_LIFETIME,
        "access_token": _issue(sim),
    }
    return reply(200, orjson.dumps(answer))


async def managed_identity(sim: Simulator, request: web.Request) -> web.StreamResponse:
    """A managed identity's token endpoint: the VM's IMDS (`Metadata: true`, api-version
    2018-02-01; expires_in as a string) at /metadata/identity/oauth2/token, or App Service's
    (`X-IDENTITY-HEADER`, api-version 2019-08-01; only expires_on) at /msi/token."""
    app_service = request.path.startswith("/msi/")
    query = request.query
    sim.record(
        {
            "path": request.path,
            "query": dict(query),
            "metadata": request.headers.get("metadata"),
            "identity_header": request.headers.get("x-identity-header"),
            "body": {},
        }
    )
    if app_service and not request.headers.get("x-identity-header"):
        return reply(401, orjson.dumps({"statusCode": 401, "message": "Unauthorized: no identity header."}))
    if not app_service and request.headers.get("metadata") != "true":
        return _entra_error(400, "invalid_request", "Required metadata header not specified")
    if query.get("api-version") != ("2019-08-01" if app_service else "2018-02-01"):
        return _entra_error(400, "invalid_request", "Invalid or missing api-version.")
    if query.get("resource") != SCOPE.removesuffix("/.default"):
        return _entra_error(400, "invalid_resource", "AADSTS500011: The resource principal was not found.")
    expires_on = str(int(time.time()) + TOKEN_LIFETIME)
    answer = {
        "access_token": _issue(sim),
        "expires_on": expires_on,
        "resource": query["resource"],
        "token_type": "Bearer",
        "client_id": query.get("client_id", "system-assigned-identity"),
    }
    if not app_service:
        answer |= {
            "expires_in": str(TOKEN_LIFETIME),
            "ext_expires_in": str(TOKEN_LIFETIME),
            "not_before": "0",
        }
    return reply(200, orjson.dumps(answer))


def _issue(sim: Simulator) -> str:
    issued = "sim-entra-" + hashlib.blake2b(os.urandom(16), digest_size=16).hexdigest()
    sim.entra_tokens.add(issued)
    return issued


def _entra_error(status: int, error: str, description: str) -> web.Response:
    return reply(status, orjson.dumps({"error": error, "error_description": description, "error_codes": []}))

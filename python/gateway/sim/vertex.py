"""Google Vertex AI: Gemini and Anthropic's models in a project, and Google's OAuth token endpoint.

  POST /v1/projects/{project}/locations/{location}/publishers/google/models/{model}:generateContent
       (and :streamGenerateContent?alt=sse)                     Gemini's bodies (sim/gemini.py)
  POST /v1/projects/{project}/locations/{location}/publishers/anthropic/models/{model}:rawPredict
       (and :streamRawPredict)                                  Messages bodies, model in the URL,
                                                                anthropic_version vertex-2023-10-16
  POST /v1/projects/{project}/locations/{location}/publishers/google/models/{model}:predict
                                                                text embeddings: instances of content
  POST /token                                                   a service account's JWT for a token

A request must carry a bearer token this simulator issued (401 UNAUTHENTICATED otherwise, as
Google answers). The token endpoint takes the JWT-bearer grant a service account's key signs (as
google-auth sends it); it reads the assertion's claims (issuer, audience, scope, expiry) without
checking its signature, which needs the key Google keeps.
"""

from __future__ import annotations

import base64
import os
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

import orjson
from aiohttp import web

from ..core import count_tokens
from . import gemini, messages
from .embeddings import vector
from .wire import anthropic_error, reply

if TYPE_CHECKING:
    from .state import Simulator

JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
SCOPE = "https://www.googleapis.com/auth/cloud-platform"
ANTHROPIC_VERSION = "vertex-2023-10-16"
TOKEN_LIFETIME = 3599
AUDIENCE = "https://oauth2.googleapis.com/token"  # what a service account's assertion is for
PREFIX = "/v1/projects/{project}/locations/{location}/publishers"


def _unauthenticated() -> web.Response:
    error = {
        "code": 401,
        "message": "Request had invalid authentication credentials. Expected OAuth 2 access token.",
        "status": "UNAUTHENTICATED",
    }
    return reply(401, orjson.dumps({"error": error}))


def _signed_in(sim: Simulator, request: web.Request) -> bool:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and token in sim.google_tokens


def _record(sim: Simulator, request: web.Request) -> None:
    sim.record({"path": request.path, "vertex": dict(request.match_info), "body": {}})


async def gemini_generate(sim: Simulator, request: web.Request) -> web.StreamResponse:
    if not _signed_in(sim, request):
        return _unauthenticated()
    _record(sim, request)
    return await gemini.answer(sim, request, stream=False)


async def gemini_stream(sim: Simulator, request: web.Request) -> web.StreamResponse:
    if not _signed_in(sim, request):
        return _unauthenticated()
    _record(sim, request)
    return await gemini.answer(sim, request, stream=True)


# Google's limits on a predict call: instances per request (gemini-embedding models take one text).
MAX_INSTANCES = 250
DEFAULT_DIMENSIONS = 768


def _invalid(message: str) -> web.Response:
    return reply(
        400, orjson.dumps({"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}})
    )


async def embedding_predict(sim: Simulator, request: web.Request) -> web.StreamResponse:
    """predict on a text embedding model: a deterministic unit vector per instance (as
    sim/embeddings.py makes them), with each text's token count, as Vertex reports it."""
    if not _signed_in(sim, request):
        return _unauthenticated()
    try:
        req = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        req = None
    model = request.match_info["model"]
    sim.record({"path": request.path, "vertex": dict(request.match_info), "body": req})
    instances = req.get("instances") if isinstance(req, dict) else None
    if not isinstance(instances, list) or not instances:
        return _invalid("instances: at least one instance is required.")
    limit = 1 if model.startswith("gemini-embedding") else MAX_INSTANCES
    if len(instances) > limit:
        return _invalid(f"{model} takes at most {limit} instance(s) per request; got {len(instances)}.")
    parameters = req.get("parameters") if isinstance(req.get("parameters"), dict) else {}
    size = parameters.get("outputDimensionality")
    dims = size if isinstance(size, int) and size > 0 else DEFAULT_DIMENSIONS
    predictions = []
    for instance in instances:
        text = instance.get("content") if isinstance(instance, dict) else None
        if not isinstance(text, str) or not text:
            return _invalid("instances[].content: a text is required.")
        statistics = {"truncated": False, "token_count": count_tokens(text)}
        predictions.append({"embeddings": {"statistics": statistics, "values": vector(text.encode(), dims)}})
    characters = sum(len(i["content"]) for i in instances)
    return reply(
        200, orjson.dumps({"predictions": predictions, "metadata": {"billableCharacterCount": characters}})
    )


async def anthropic_predict(sim: Simulator, request: web.Request) -> web.StreamResponse:
    """rawPredict and streamRawPredict: the Messages API with the model in the URL."""
    if not _signed_in(sim, request):
        return _unauthenticated()
    _record(sim, request)
    body = await request.read()
    try:
        req = orjson.loads(body)
    except orjson.JSONDecodeError:
        req = None
    if not isinstance(req, dict) or req.get("anthropic_version") != ANTHROPIC_VERSION:
        return anthropic_error(400, f"anthropic_version: must be {ANTHROPIC_VERSION!r} on Vertex AI")
    if "model" in req:
        return anthropic_error(400, "model: Extra inputs are not permitted (the URL names the model)")
    return await messages.answer(sim, request, body, {**req, "model": request.match_info["model"]})


async def token(sim: Simulator, request: web.Request) -> web.StreamResponse:
    form = {k: v[-1] for k, v in parse_qs((await request.read()).decode(errors="replace")).items()}
    claims = _claims(form.get("assertion", "")) if form.get("grant_type") == JWT_BEARER else None
    sim.record({"path": "/token", "claims": claims, "body": {}})
    if (
        claims is None
        or not isinstance(claims.get("iss"), str)
        or claims.get("aud") != AUDIENCE
        or SCOPE not in str(claims.get("scope", "")).split()
        or not isinstance(claims.get("exp"), int)
        or claims["exp"] < time.time()
    ):
        error = {
            "error": "invalid_grant",
            "error_description": "Invalid JWT: claims or expiry are not valid.",
        }
        return reply(400, orjson.dumps(error))
    issued = "sim-google-" + os.urandom(16).hex()
    sim.google_tokens.add(issued)
    return reply(
        200, orjson.dumps({"access_token": issued, "expires_in": TOKEN_LIFETIME, "token_type": "Bearer"})
    )


def _claims(assertion: str) -> dict[str, Any] | None:
    """A JWT's claims, read without its signature."""
    parts = assertion.split(".")
    if len(parts) != 3:
        return None
    try:
        claims = orjson.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, orjson.JSONDecodeError):
        return None
    return claims if isinstance(claims, dict) else None

"""API keys: how they look, how they are stored (a hash only) and how a request proves one."""

from __future__ import annotations

import hashlib
import secrets
import time

from starlette.requests import Request

from .errors import GatewayError
from .store import KeyContext, Store

KEY_PREFIX = "sk-"


def generate_key() -> str:
    """A new key: sk- and 256 random bits. Shown once; only its hash is kept."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> bytes:
    # The key holds 256 random bits, so a fast hash is as safe as a slow one and costs microseconds.
    return hashlib.sha256(key.encode()).digest()


def display_prefix(key: str) -> str:
    return key[:10]


def presented_key(request: Request) -> str | None:
    """`Authorization: Bearer sk-...`, or `x-api-key: sk-...` as the message-shape clients send it."""
    header = request.headers.get("authorization")
    if header is not None:
        scheme, _, token = header.partition(" ")
        return token.strip() if scheme.lower() == "bearer" else None
    return request.headers.get("x-api-key")


async def authenticate(request: Request, store: Store) -> KeyContext:
    """The caller's key and account, or 401 (spec 5). Runs before anything reaches a model."""
    token = presented_key(request)
    if not token:
        raise GatewayError(
            "invalid_api_key", "No API key provided. Send the header Authorization: Bearer sk-..."
        )
    if not token.startswith(KEY_PREFIX):
        raise GatewayError("invalid_api_key", "Invalid API key: keys begin with sk-.")
    ctx = await store.find_key(hash_key(token))
    if ctx is None:
        raise GatewayError("invalid_api_key", "Invalid API key: unknown or deleted.")
    expires = ctx.key.expires_at_ms
    if expires is not None and time.time_ns() // 1_000_000 >= expires:
        raise GatewayError("key_expired", "This API key has expired. Create a new key in the console.")
    return ctx

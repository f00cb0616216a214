"""API keys: how they look, how they are stored (a hash only) and how a request proves one; and the
admin token that the management API takes instead."""

from __future__ import annotations

import hmac
import os
import secrets
import time

from starlette.requests import Request

from .config import ConfigError, Settings
from .core import key_digest
from .errors import GatewayError
from .ratelimits import key_slot
from .store import KeyContext, Store

KEY_PREFIX = "sk-"
MIN_ADMIN_TOKEN_CHARS = 32


def generate_key() -> str:
    """A new key: sk- and 256 random bits. Shown once; only its hash is kept."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> bytes:
    """SHA-256 of the key (in the Rust core: see its key_digest.rs). The key holds 256 random bits,
    so a fast hash is as safe as a slow one."""
    return key_digest(key)


def display_prefix(key: str) -> str:
    return key[:10]


def bearer_token(request: Request) -> str | None:
    """The token of `Authorization: Bearer <token>`; None without that header or with another scheme."""
    header = request.headers.get("authorization")
    return None if header is None else _bearer(header)


def _bearer(header: str) -> str | None:
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


def presented_key(request: Request) -> str | None:
    """`Authorization: Bearer sk-...`, or `x-api-key: sk-...` as the message-shape clients send it
    (Authorization first). Either header twice is 400: RFC 9110 allows each once, and a proxy in
    front that read the other copy would authorise another key than the gateway bills."""
    # Read from the scope's header list in one pass (names come lowercased, as ASGI has them): a
    # request's first look through Starlette's Headers, made here on every model request, costs
    # ~7 µs in a loaded worker and ~17 µs before a stream's first token.
    authorization: bytes | None = None
    api_key: bytes | None = None
    hosts = 0
    for name, value in request.scope["headers"]:
        if name == b"authorization":
            if authorization is not None:
                raise _twice("Authorization")
            authorization = value
        elif name == b"x-api-key":
            if api_key is not None:
                raise _twice("x-api-key")
            api_key = value
        elif name == b"host":
            hosts += 1
    if hosts > 1:
        # RFC 9112 3.2: a request with two Host lines is answered 400 (the server took it;
        # protocol review): which one a proxy in front read cannot be known. One left out is the
        # server's to refuse, which sets it empty instead (an empty Host is a valid one).
        raise GatewayError("invalid_request", "The Host header is given more than once: send one.")
    if authorization is not None:
        return _bearer(authorization.decode("latin-1"))
    return None if api_key is None else api_key.decode("latin-1")


def _twice(header: str) -> GatewayError:
    return GatewayError("invalid_request", f"The {header} header is given more than once: send one.")


# An ASGI scope entry, set only by the gateway's own console when it runs a playground request in
# process under the account's playground key (clients cannot set scope entries): its KeyContext.
CONSOLE_CALL = "gateway.console_call"


async def authenticate(request: Request, store: Store) -> KeyContext:
    """The caller's key and account, or 401 (spec 5). Runs before anything reaches a model. The
    answer's x-ratelimit-* headers come from what it found (gateway.ratelimit_headers)."""
    slot = key_slot(request.scope)
    if slot is not None:
        slot.checked = True
    ctx: KeyContext | None = request.scope.get(CONSOLE_CALL)
    if ctx is None:
        ctx = await _key_presented(request, store)
    expires = ctx.key.expires_at_ms
    if expires is not None and time.time_ns() // 1_000_000 >= expires:
        raise GatewayError("key_expired", "This API key has expired. Create a new key in the console.")
    if slot is not None:
        slot.ctx = ctx
    return ctx


async def presented_context(request: Request, store: Store) -> KeyContext | None:
    """The key a request presented, when it is valid: the one its route found, else (no route
    looked at it: an unknown path, a wrong method) looked up now; None without a valid key."""
    slot = key_slot(request.scope)
    if slot is not None and slot.checked:
        return slot.ctx
    try:
        if not presented_key(request):
            return None
        return await authenticate(request, store)
    except GatewayError:
        return None


async def _key_presented(request: Request, store: Store) -> KeyContext:
    """The key of the Authorization header (the console's playground brings its own: CONSOLE_CALL)."""
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
    return ctx


def admin_token(settings: Settings) -> str | None:
    """The management API's token, from the environment variable the settings name (never from the
    file); None when it is not configured, which disables that API."""
    token = os.environ.get(settings.admin_token_env) if settings.admin_token_env else None
    if not token:
        return None
    problem = admin_token_problem(settings.admin_token_env or "")
    if problem is not None:
        raise ConfigError(problem)
    return token


def admin_token_problem(env: str) -> str | None:
    """Why the admin token in the environment variable `env` is refused, when it is set and is (also
    `gateway check-config`'s finding: it checks what `serve` will refuse)."""
    token = os.environ.get(env)
    if token and (
        token.startswith(KEY_PREFIX)
        or len(token) < MIN_ADMIN_TOKEN_CHARS
        or any(c.isspace() for c in token)  # no header can carry it: every call would be refused
    ):
        return (
            f"{env}: the admin token must have at least {MIN_ADMIN_TOKEN_CHARS}"
            f" characters, no spaces or line breaks, and must not begin with {KEY_PREFIX}"
            " (e.g. `openssl rand -hex 32`)"
        )
    return None


def authenticate_admin(request: Request, token: str | None) -> None:
    """Let the request through only with the admin token. An API key, even a valid one, is refused
    with 403 forbidden: keys cannot manage keys (spec 5.6)."""
    presented = presented_key(request)
    if presented and presented.startswith(KEY_PREFIX):
        raise GatewayError(
            "forbidden", "An API key cannot manage accounts or keys: use the console or the admin token."
        )
    if token is None:
        raise GatewayError(
            "forbidden", "The management API is disabled: no admin token is configured ([admin] token_env)."
        )
    if not presented:
        raise GatewayError(
            "invalid_admin_token", "No admin token provided. Send the header Authorization: Bearer <token>."
        )
    # Bytes, compared in constant time: the time taken says nothing about how much of a guess matched.
    if not hmac.compare_digest(presented.encode(), token.encode()):
        raise GatewayError("invalid_admin_token", "Invalid admin token.")

"""Idempotency-Key on the endpoints that honour it (spec 8): image generations and edits, speech
(and video jobs once they exist); ignored everywhere else.

Keys are scoped to the API key. The first request with a key runs and its answer is kept 24 hours;
the same key with the same body (the Rust core's fingerprint: JSON canonicalised, multipart reduced
to its parts) gets that answer again byte for byte with `Idempotency-Replayed: true`, and nothing
runs or is charged; with another body it is 409 idempotency_key_reused; while the first still runs,
409 idempotency_key_in_progress with Retry-After. The running mark is a lease in the store (the
synchronous window plus a minute), so a crashed gateway never leaves a key stuck.

Kept: every answer of a request that claimed its key, errors included (spec 7.5.4: the credit
refusals too), except 5xx (the retry runs again), 429s and answers over 8 MB (the request ran;
nothing to replay). A 429 tells its client to wait and send the request again (spec 7.2, 7.4: a
`rate_limited` one has a Retry-After): kept, that retry got the same 429 back for 24 hours, without
the Retry-After 7.2 promises (review). A departure from 7.5.4's letter (only 5xx exempt), where it
conflicts with 7.2 and 7.4. A request refused at the door, for its key or its key's
requests per minute, never claims one: those answers are not kept either.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable

import orjson
from starlette.requests import Request
from starlette.responses import Response

from .clock import now_ms
from .context import Call
from .core import fingerprint
from .errors import GatewayError, ServiceUnavailable, invalid_request
from .state import GatewayState
from .store import KeptAnswer, StoredAnswer

HEADER = "idempotency-key"
# Answers being kept in the background (keep_when_possible), held here until they are.
_KEEPING: set[asyncio.Future[None]] = set()
log = logging.getLogger("gateway.idempotency")
REPLAYED_HEADER = "idempotency-replayed"
MAX_KEY_CHARS = 255
MAX_STORED_BYTES = 8 * 1024 * 1024
TTL_MS = 24 * 3600 * 1000
# How long a request holds its key before another may take it over (its process having died).
LEASE_MARGIN_MS = 60_000
# Headers that belong to one request, not to its answer: never replayed. The rate-limit headers
# and Retry-After said the buckets' state at that moment: a replay carries the buckets' state now
# (gateway.ratelimit_headers), and no wait, since the same answer comes back however long one waits.
PER_REQUEST_HEADERS = frozenset({"x-service-request-id", "x-service-cost", "content-length", "retry-after"})
_RATE_HEADER_PREFIX = "x-ratelimit-"


def _replayable(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    return [
        (k, v)
        for k, v in headers
        if k.lower() not in PER_REQUEST_HEADERS and not k.lower().startswith(_RATE_HEADER_PREFIX)
    ]


def requested_key(request: Request) -> str | None:
    given = request.headers.getlist(HEADER)
    if len(given) > 1:  # which one a proxy in front read is anyone's guess, as for Authorization
        raise invalid_request(
            "The Idempotency-Key header is given more than once: send one.", "Idempotency-Key"
        )
    key = given[0] if given else None
    if key is not None and not 0 < _characters(key) <= MAX_KEY_CHARS:
        raise invalid_request(
            f"The Idempotency-Key header must have 1 to {MAX_KEY_CHARS} characters.", "Idempotency-Key"
        )
    return key


def _characters(value: str) -> int:
    """A header value's length in characters: the server hands its bytes over as Latin-1, so a key
    of 255 Cyrillic letters (510 bytes of UTF-8) would count 510 (review); bytes that are no UTF-8
    count one each."""
    if value.isascii():
        return len(value)
    raw = value.encode("latin-1", errors="replace")
    try:
        return len(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return len(raw)


async def claim(state: GatewayState, request: Request, call: Call, key: str, body: bytes) -> Response | None:
    """Take the key for this request (None: run it), or the answer to give instead."""
    digest = fingerprint(request.method, request.url.path, body, request.headers.get("content-type"))
    lease_ms = int(state.settings.sync_timeout_seconds * 1000) + LEASE_MARGIN_MS
    outcome = await state.store.claim_idempotency(call.ctx.key.id, key, digest, now_ms(), lease_ms, TTL_MS)
    if outcome.outcome == "run":
        # Held only once taken (review: a claim the store could not take left the request holding
        # the key, and letting it go failed again, in place of the request's own answer).
        call.idempotency = (key, digest)
        return None
    call.model = _named_model(state, request, call, body)  # for its log entry: nothing else reads it
    if outcome.outcome == "reused":
        raise GatewayError(
            "idempotency_key_reused",
            "This Idempotency-Key was already used with a different request body.",
            # The official clients retry every 409; this one comes back the same for 24 hours.
            headers={"x-should-retry": "false"},
        )
    if outcome.outcome == "in_progress":
        raise GatewayError(
            "idempotency_key_in_progress",
            "A request with this Idempotency-Key is still running. Retry after it has finished.",
            headers={"retry-after": "1"},
        )
    answer = outcome.answer
    assert answer is not None
    # Filtered again: answers kept before these headers were left out may carry them.
    headers = {**dict(_replayable(answer.headers)), REPLAYED_HEADER: "true", "x-service-cost": "0"}
    return Response(answer.body, status_code=answer.status, headers=headers)


def _named_model(state: GatewayState, request: Request, call: Call, body: bytes) -> str | None:
    """The model a request that does not run names (a replay, a refusal of its key), as the
    registry calls it, for its log entry; None when it names none the key may see."""
    from .routes.multipart import form_parts  # the routes import this module

    content_type = request.headers.get("content-type", "")
    name: object = None
    parts = form_parts(body, content_type, repeatable=None)
    if parts is not None:
        name = next((p.data.decode(errors="replace") for p in parts if p.name == "model"), None)
    else:
        with contextlib.suppress(orjson.JSONDecodeError, AttributeError):
            name = orjson.loads(body).get("model")
    try:
        return state.registry.lookup(name, call.ctx, vendor="openai").name
    except GatewayError:
        return None


def replayed_error_code(replay: Response) -> str | None:
    """The error `code` of a replayed error answer, for its log entry (spec 7.5.3); else None."""
    if replay.status_code < 400:
        return None
    try:
        error = orjson.loads(replay.body).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None


def kept_answer(call: Call, status: int, headers: dict[str, str], body: bytes) -> KeptAnswer | None:
    """The answer the request's key keeps, for the store to keep in the same step as what the
    request did (Store.settle, Store.create_job; `taken` once it has); None when the request holds
    no key or its answer is not kept (5xx, 429, over 8 MB)."""
    if call.idempotency is None or status >= 500 or status == 429 or len(body) > MAX_STORED_BYTES:
        return None
    key, digest = call.idempotency
    answer = StoredAnswer(status, tuple(_replayable(headers.items())), body)
    return KeptAnswer(call.ctx.key.id, key, digest, answer, now_ms() + TTL_MS)


def kept_response(call: Call, response: Response) -> KeptAnswer | None:
    """kept_answer of a whole answer (its body in hand); None at once for a request without a key."""
    if call.idempotency is None:
        return None
    return kept_answer(call, response.status_code, dict(response.headers), bytes(response.body))


def taken(call: Call) -> None:
    """The store has kept the request's answer for its key with what it did: nothing left to keep."""
    call.idempotency = None


async def keep(state: GatewayState, call: Call, status: int, headers: dict[str, str], body: bytes) -> None:
    """The request that held the key has answered: keep the answer, or forget the key when the
    answer is not kept (5xx, 429, over 8 MB)."""
    kept = kept_answer(call, status, headers, body)
    if kept is None:
        await forget(state, call)
        return
    call.idempotency = None
    await state.store.finish_idempotency(
        kept.key_id, kept.idempotency_key, kept.fingerprint, kept.answer, now_ms(), TTL_MS
    )


def keep_when_possible(
    state: GatewayState, call: Call, status: int, headers: dict[str, str], body: bytes
) -> None:
    """Keep the answer of a request that ran and was charged although the store cannot take the
    answer now (it is unreachable): retried in the background until it can, while the key's claim
    lasts, so that a retry with the key replays this answer instead of running, and being charged,
    again."""
    if call.idempotency is None:
        return
    held = call.idempotency
    deadline = time.monotonic() + state.settings.sync_timeout_seconds + LEASE_MARGIN_MS / 1000

    async def retry() -> None:
        while time.monotonic() < deadline:
            call.idempotency = held
            try:
                await keep(state, call, status, headers, body)
                return
            except ServiceUnavailable:
                await asyncio.sleep(1.0)
        log.error("the answer of %s could not be kept for its Idempotency-Key", call.request_id)

    task = asyncio.ensure_future(retry())
    _KEEPING.add(task)
    task.add_done_callback(_KEEPING.discard)


def kept_error(call: Call, err: GatewayError) -> KeptAnswer | None:
    """kept_answer of an error answer."""
    return kept_answer(call, err.status, _error_headers(err), err.body())


async def keep_error(state: GatewayState, call: Call, err: GatewayError) -> None:
    await keep(state, call, err.status, _error_headers(err), err.body())


def _error_headers(err: GatewayError) -> dict[str, str]:
    return {**err.headers, "content-type": "application/json"}


async def forget(state: GatewayState, call: Call) -> None:
    """Let the key go: the next request with it runs."""
    if call.idempotency is None:  # this request does not hold a key, or has finished with it
        return
    key, digest = call.idempotency
    call.idempotency = None
    await state.store.finish_idempotency(call.ctx.key.id, key, digest, None, now_ms(), TTL_MS)

"""Request logs: one entry for every model request, failures included (spec 1.4.3, 7.3.2, 7.5.3),
with its status, latency, cost, model, key and both bodies (each kept up to
`[logs] max_body_bytes`; bodies are purged after `[logs] body_retention_days`, the rest is kept).

Entries are written like settlements, with the next group commit and nobody waiting, so logging
costs the request path one queue put. Unlike a charge, an entry is not journaled: a killed process
can lose the entries of its last few milliseconds, never a charge or a usage record.
"""

from __future__ import annotations

from decimal import Decimal

import orjson
from starlette.requests import Request

from .clock import span_ms
from .context import Call
from .ids import request_id
from .routing import Attempt
from .state import GatewayState
from .store import RequestLog

# Where read_body leaves the request's bytes for the log entry.
BODY_SCOPE_KEY = "gateway.request_body"
# The bytes of a body that was not read whole (the client left, stopped, or sent past the limit):
# what its log entry's request_bytes says, its body kept by nobody.
RECEIVED_SCOPE_KEY = "gateway.request_received"
# Set once a request has its log entry, so that the error handlers do not log it again (gateway.app).
LOGGED = "gateway.logged"
# What a streamed text answer is kept as: {"object": STREAM_SUMMARY, "id", "output_text", "usage",
# "error"}, written by routes/streaming.py; the events themselves would be tens of KB a request.
STREAM_SUMMARY = "stream.summary"
# An answer that never went out: the client left before the gateway answered (as nginx logs it).
CLIENT_CLOSED = 499


def keep_request_body(request: Request, body: bytes) -> None:
    request.scope[BODY_SCOPE_KEY] = body


def note_received(request: Request, size: int) -> None:
    """A body abandoned after `size` bytes (read_body's refusals): its log entry says so."""
    request.scope[RECEIVED_SCOPE_KEY] = size


class BodyCapture:
    """The first `limit` bytes of a streamed answer, and how many bytes went out in all."""

    __slots__ = ("_kept", "_limit", "_parts", "size")

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._parts: list[bytes] = []
        self._kept = 0
        self.size = 0

    def add(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self._kept < self._limit:
            part = chunk[: self._limit - self._kept]
            self._parts.append(part)
            self._kept += len(part)

    def body(self) -> bytes:
        return b"".join(self._parts)


def entry(
    body_limit: int,
    request: Request,
    *,
    started_ns: int,
    status: int,
    response_body: bytes | None,
    response_bytes: int | None = None,
    log_id: str | None = None,
    key_id: str | None = None,
    account_id: str | None = None,
    model: str | None = None,
    error_code: str | None = None,
    cost: Decimal | None = None,
    usage_id: str | None = None,
    attempts: list[Attempt] | None = None,
    keep_request: bool = True,
    dropped_params: tuple[str, ...] = (),
) -> RequestLog:
    """One request's log entry, bodies cut to `body_limit` bytes. A request refused for its key
    has no request id (spec 7.3.1): its entry gets an id of its own and keeps no bodies, since
    nobody it could belong to may read them."""
    raw: bytes | None = request.scope.get(BODY_SCOPE_KEY)
    started_at_ms, ended_at_ms = span_ms(started_ns)
    request_bytes = len(raw) if raw is not None else request.scope.get(RECEIVED_SCOPE_KEY, 0)
    # Positional, in field order (LOG_COLUMNS, on which the rows and the journal rely too): with
    # keywords, making a record of 17 fields takes 0.5 us more, on every request.
    return RequestLog(
        log_id or request_id(),  # id
        key_id,
        account_id,
        request.method,
        request.scope["path"],  # as the server decoded it (request.url costs a URL parse)
        model,
        status,
        error_code,
        started_at_ms,
        ended_at_ms - started_at_ms,  # duration_ms
        cost,
        usage_id,
        _attempts_json(attempts, dropped_params) if attempts else None,
        raw[:body_limit] if raw is not None and keep_request else None,  # request_body
        request_bytes,
        None if response_body is None else response_body[:body_limit],
        len(response_body or b"") if response_bytes is None else response_bytes,
    )


def _attempts_json(attempts: list[Attempt], dropped_params: tuple[str, ...]) -> str:
    """The attempts as the log keeps them (Attempt.logged); each try of the model itself (not of a
    safety check) also names the parameters the model does not take, dropped on the way to it
    (`dropped_params`), when there were any."""
    tried = [attempt.logged() for attempt in attempts]
    if dropped_params:
        dropped = list(dropped_params)
        for logged in tried:
            if "check" not in logged:
                logged["dropped_params"] = dropped
    return orjson.dumps(tried).decode()


def entry_for(
    state: GatewayState,
    request: Request,
    call: Call,
    status: int,
    body: bytes | None,
    size: int | None = None,
    error_code: str | None = None,
) -> RequestLog:
    """The log entry of an authenticated model request as it stands (gateway.billing.close makes it
    durable with the request's charge)."""
    return entry(
        state.settings.log_max_body_bytes,
        request,
        started_ns=call.started_ns,
        status=status,
        response_body=body,
        response_bytes=size,
        log_id=call.request_id,
        key_id=call.ctx.key.id,
        account_id=call.ctx.account.id,
        model=call.model,
        error_code=error_code,
        cost=call.charged,
        usage_id=call.usage_id,
        attempts=call.attempts,
        dropped_params=call.dropped_params,
    )


def record_refusal(
    state: GatewayState,
    request: Request,
    started_ns: int,
    status: int,
    body: bytes,
    code: str,
    log_id: str | None = None,
) -> None:
    """Log a request that ended before its key was known (it has no call: no key or account): a
    key refused has no request id; a key that could not be checked has `log_id`, the id its answer
    carries."""
    request.scope[LOGGED] = True
    state.store.log_request(
        entry(
            state.settings.log_max_body_bytes,
            request,
            started_ns=started_ns,
            status=status,
            response_body=body,
            log_id=log_id,
            error_code=code,
            keep_request=False,
        )
    )

"""W3C trace context: a client's `traceparent` is taken up, and every try upstream carries the same
trace with a span id of its own, so that a request can be followed from the client through the
gateway to the model's provider. A request without one starts a trace of its own (its id is in the
request's log line either way). The request's ids come from the Rust core (request_trace: its
header read and its ids drawn in one call, from the OS randomness ids use, read ahead); a try's
span comes from `random`: W3C asks ids to be unique, not secret.

The spans, when exported (telemetry.otlp): the request's own (`span_id`, a child of the client's
span) and, under it, one per try upstream, whose id is the one that try sent (routing.Attempt)."""

from __future__ import annotations

import random
from typing import Final

from starlette.types import Scope

from ..core import request_trace
from ..frozen import frozen
from ..routing import CURRENT_ATTEMPT

SCOPE_KEY: Final = "gateway.trace"


@frozen
class Trace:
    """One request's place in a trace: ids in lowercase hex, as W3C writes them."""

    trace_id: str
    flags: str  # "01": sampled
    parent_id: str | None  # the client's span; None when the trace starts here
    span_id: str  # the gateway's own span for the request

    @property
    def sampled(self) -> bool:
        return int(self.flags, 16) & 1 == 1


def trace(scope: Scope) -> Trace:
    """The request's trace: the client's when its traceparent header is valid (version ff and
    all-zero ids are not), else a new one, sampled."""
    found: Trace | None = scope.get(SCOPE_KEY)
    if found is None:
        found = scope[SCOPE_KEY] = Trace(*request_trace(scope.get("headers", ())))
    return found


def upstream_traceparent(scope: Scope) -> str:
    """The traceparent header of one try upstream: the request's trace, the try's span (a new one
    for what is not a try of the router's)."""
    request = trace(scope)
    attempt = CURRENT_ATTEMPT.get()
    span = attempt.span_id if attempt is not None and attempt.span_id else random.getrandbits(64) or 1
    # hex() and zfill, not a :016x format spec: a spec is parsed each time (~2,000 instructions).
    return f"00-{request.trace_id}-{hex(span)[2:].zfill(16)}-{request.flags}"

"""W3C trace context: a client's `traceparent` is taken up, and every try upstream carries the same
trace with a span id of its own, so that a request can be followed from the client through the
gateway to the model's provider. A request without one starts a trace of its own (its id is in the
request's log line either way). Ids come from `random`, not the OS's entropy: W3C asks them to be
unique, not secret, and os.urandom is a system call a try.

The spans, when exported (telemetry.otlp): the request's own (`span_id`, a child of the client's
span) and, under it, one per try upstream, whose id is the one that try sent (routing.Attempt)."""

from __future__ import annotations

import random
import re
from typing import Final

from starlette.types import Scope

from ..frozen import frozen
from ..routing import CURRENT_ATTEMPT

SCOPE_KEY: Final = "gateway.trace"
_TRACEPARENT: Final = re.compile(rb"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_ZERO_TRACE: Final = b"0" * 32
_ZERO_SPAN: Final = b"0" * 16
# All-zero ids are invalid (W3C): a draw of zeros, once in 2**64 or 2**128, becomes ...01.
_ZERO_TRACE_TEXT: Final = "0" * 32
_ZERO_SPAN_TEXT: Final = "0" * 16
_ONE_TRACE: Final = f"{1:032x}"
_ONE_SPAN: Final = f"{1:016x}"


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
    if found is not None:
        return found
    # One draw for both ids a new trace needs: its trace id (128 bits) and the gateway's span (64).
    ids = f"{random.getrandbits(192):048x}"
    span_id = ids[32:] if ids[32:] != _ZERO_SPAN_TEXT else _ONE_SPAN
    for name, value in scope.get("headers", ()):
        if name == b"traceparent":
            match = _TRACEPARENT.match(value.strip().lower())
            if match and match[1] != b"ff" and match[2] != _ZERO_TRACE and match[3] != _ZERO_SPAN:
                found = Trace(match[2].decode(), match[4].decode(), match[3].decode(), span_id)
            break
    if found is None:
        found = Trace(ids[:32] if ids[:32] != _ZERO_TRACE_TEXT else _ONE_TRACE, "01", None, span_id)
    scope[SCOPE_KEY] = found
    return found


def upstream_traceparent(scope: Scope) -> str:
    """The traceparent header of one try upstream: the request's trace, the try's span (a new one
    for what is not a try of the router's)."""
    request = trace(scope)
    attempt = CURRENT_ATTEMPT.get()
    span = attempt.span_id if attempt is not None and attempt.span_id else random.getrandbits(64) or 1
    return f"00-{request.trace_id}-{span:016x}-{request.flags}"

"""W3C trace context: a client's `traceparent` is taken up, and every try upstream carries the same
trace with a span id of its own, so that a request can be followed from the client through the
gateway to the model's provider. A request without one starts a trace of its own (its id is in the
request's log line either way). Ids come from `random`, not the OS's entropy: W3C asks them to be
unique, not secret, and os.urandom is a system call a try."""

from __future__ import annotations

import random
import re
from typing import Final

from starlette.types import Scope

SCOPE_KEY: Final = "gateway.trace"
_TRACEPARENT: Final = re.compile(rb"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_ZERO_TRACE: Final = b"0" * 32
_ZERO_SPAN: Final = b"0" * 16


def trace(scope: Scope) -> tuple[str, str]:
    """The request's (trace id, flags): the client's when its traceparent header is valid (version
    ff and all-zero ids are not), else a new trace, sampled."""
    found: tuple[str, str] | None = scope.get(SCOPE_KEY)
    if found is not None:
        return found
    found = None
    for name, value in scope.get("headers", ()):
        if name == b"traceparent":
            match = _TRACEPARENT.match(value.strip().lower())
            if match and match[1] != b"ff" and match[2] != _ZERO_TRACE and match[3] != _ZERO_SPAN:
                found = (match[2].decode(), match[4].decode())
            break
    if found is None:
        found = (f"{random.getrandbits(128):032x}", "01")
    scope[SCOPE_KEY] = found
    return found


def upstream_traceparent(scope: Scope) -> str:
    """The traceparent header of one try upstream: the request's trace, a new span."""
    trace_id, flags = trace(scope)
    return f"00-{trace_id}-{random.getrandbits(64) or 1:016x}-{flags}"

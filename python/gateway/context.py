"""One model request's context, from the moment its key was accepted to its end: who is calling,
what it holds, what was charged, the channels it tried. Passed as one object through the route, the
transports and billing (gateway.billing decides and settles; the rest only report)."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal

from .errors import ErrorCode
from .funds import Hold
from .ratelimits import RateState
from .routing import Attempt
from .store import KeyContext, UsageRecord
from .telemetry.tracing import Trace


@dataclass(slots=True)
class Call:
    """One authenticated model request, from the moment its key was accepted."""

    ctx: KeyContext
    request_id: str
    started_ns: int  # its arrival on the monotonic clock (clock.instant_ns; wall times: clock.span_ms)
    hold: Hold | None = None
    # Of the prompt as the gateway counted it, its audio's tokens (routes/text.check_and_hold):
    # billed at their price when the upstream reports no usage.
    prompt_audio: int = 0
    rate: RateState | None = None  # what it took from its key's rate limits
    # Filled in as the request goes, for its request log entry.
    model: str | None = None
    charged: Decimal | None = None
    usage_id: str | None = None
    error_code: ErrorCode | None = None  # why a stream that had started ended early
    # (Idempotency-Key, fingerprint) while this request holds the key (gateway.idempotency).
    idempotency: tuple[str, str] | None = None
    attempts: list[Attempt] = field(default_factory=list)  # the channels tried (gateway.routing)
    # The request's parameters the model does not take, dropped on the way upstream (spec 1.3;
    # gateway.registry notes them): shown with the attempts in the log entry. Empty: none.
    dropped_params: tuple[str, ...] = ()
    # The charge billing.settle decided, made durable with the log entry when the request closes.
    settlement: UsageRecord | None = None
    progress_noted: bool = False  # a running stream journaled its progress (billing.note_progress)
    # Whether the client leaving cancels the request at once (routes/common.py); a request that has
    # started a job upstream must run to its end so that the job is recorded.
    cancel_on_disconnect: bool = True
    client_gone: bool = False
    # For the metrics and the request's log line (gateway.telemetry): the route template, the W3C
    # trace, the time spent waiting for the upstream (a stream: to its first chunk), and when a
    # stream's first byte went out (clock.instant_ns; 0: not a stream, or none went out).
    endpoint: str = ""
    trace: Trace | None = None
    upstream_ns: int = 0
    first_byte_ns: int = 0

"""What operators see of each request: its metrics (telemetry.metrics) and its log line
(telemetry.logs), both from the one place a request's end is known. Model requests report at their
close (gateway.billing.close), after their charge is settled, with their usage and timings;
refusals for the key from routes/common.py; every other answer (lists, lookups, the management
API, the console) from the outermost middleware (gateway.edge)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

from starlette.types import Scope

from ..clock import instant_ns
from ..core import answer_line
from ..pricing import format_cost
from .logs import ACCESS
from .metrics import Observer

if TYPE_CHECKING:
    from ..context import Call
    from ..store import RequestLog, UsageRecord
    from .otlp import SpanExport

# The scope flag a model request sets: it reports itself at its close, not through the middleware.
MODEL_REQUEST: Final = "gateway.model_request"
# Paths whose answers are counted but not logged line by line (probes and scrapes).
QUIET_PATHS: Final = frozenset({"/health", "/ready", "/metrics"})


def endpoint_of(scope: Scope) -> str:
    """The route template the request matched ("/v1/videos/{video_id}"), never the raw path: a
    label must come from a bounded set."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else "unmatched"


class Telemetry:
    def __init__(self, models: Iterable[tuple[str, Iterable[str]]], spans: SpanExport | None = None) -> None:
        self.metrics = Observer(models)
        self.spans = spans  # the OpenTelemetry exporter, when [tracing] otlp_endpoint is set

    def model_request(self, call: Call, entry: RequestLog, record: UsageRecord | None) -> None:
        """A model request has ended (and its charge, if any, is settled): its metrics and its line,
        in one call to the Rust core (RequestTally)."""
        now_ns = time.time_ns()  # the line's time; the durations are the monotonic clock's
        elapsed_ns = instant_ns() - call.started_ns
        attempts = [
            (attempt.channel, attempt.error or "ok")
            for attempt in call.attempts
            if getattr(attempt, "check", None) is None  # a safety check's try is not the model's
        ]
        ctx = call.ctx
        line = self.metrics.tally.model_request(
            call.endpoint,
            call.model,
            entry.status,
            entry.error_code,
            elapsed_ns,
            call.upstream_ns,
            call.first_byte_ns - call.started_ns if call.first_byte_ns else 0,
            attempts,
            0 if record is None else record.prompt_tokens,
            0 if record is None else record.completion_tokens,
            None if record is None else format_cost(record.cost),
            ACCESS.format,
            now_ns,
            call.request_id,
            call.trace.trace_id if call.trace else None,
            ctx.account.id,
            ctx.key.id,
            entry.method,
        )
        if line is not None:
            ACCESS.add(line)
        if self.spans is not None:
            self.spans.model_request(call, entry, record, now_ns)

    def answered(
        self, scope: Scope, status: int, code: str | None, started_ns: int, trace_id: str | None = None
    ) -> None:
        """Any other request has been answered (a refusal for the key included)."""
        endpoint = endpoint_of(scope)
        self.metrics.request(endpoint, None, status, code)
        line_format = ACCESS.format
        if line_format is None or scope.get("path") in QUIET_PATHS:
            return
        now_ns = time.time_ns()
        method = scope.get("method", "")
        duration_ns = instant_ns() - started_ns
        ACCESS.add(answer_line(line_format, now_ns, trace_id, method, endpoint, status, code, duration_ns))


# Where error_response notes the code of an error answer, for the middleware's count.
ERROR_CODE: Final = "gateway.error_code"

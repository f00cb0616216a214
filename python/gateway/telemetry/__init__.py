"""What operators see of each request: its metrics (telemetry.metrics) and its log line
(telemetry.logs), both from the one place a request's end is known. Model requests report at their
close (gateway.billing.close), after their charge is settled, with their usage and timings;
refusals for the key from routes/common.py; every other answer (lists, lookups, the management
API, the console) from the outermost middleware (gateway.edge)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final

from starlette.types import Scope

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
        """A model request has ended (and its charge, if any, is settled)."""
        now_ns = time.time_ns()
        total_s = (now_ns - call.started_ns) / 1e9
        upstream_s = call.upstream_ns / 1e9 if call.upstream_ns else None
        first_byte_s = (call.first_byte_ns - call.started_ns) / 1e9 if call.first_byte_ns else None
        if upstream_s is None:
            added_s = None
        elif first_byte_s is not None:
            added_s = first_byte_s - upstream_s
        else:
            added_s = total_s - upstream_s
        metrics = self.metrics
        metrics.request(
            call.endpoint,
            call.model,
            entry.status,
            entry.error_code,
            added_s=added_s,
            upstream_s=upstream_s,
            first_byte_s=first_byte_s,
        )
        channels = []
        for attempt in call.attempts:
            if getattr(attempt, "check", None) is None:  # a safety check's try is not the model's
                metrics.attempt(call.model, attempt.channel, attempt.error or "ok")
                channels.append(attempt.channel)
        if len(set(channels)) > 1:
            metrics.failover(call.model)
        if record is not None:
            metrics.usage(record.model, record.prompt_tokens, record.completion_tokens, record.cost)
        if self.spans is not None:
            self.spans.model_request(call, entry, record, now_ns)
        if ACCESS.enabled:
            fields: dict[str, Any] = {
                "request_id": call.request_id,
                "trace_id": call.trace.trace_id if call.trace else None,
                "account_id": call.ctx.account.id,
                "key_id": call.ctx.key.id,
                "method": entry.method,
                "endpoint": call.endpoint,
                "model": call.model,
                "status": entry.status,
                "code": entry.error_code,
                "duration_ms": round(total_s * 1000, 3),
                "added_ms": None if added_s is None else round(added_s * 1000, 3),
                "upstream_ms": None if upstream_s is None else round(upstream_s * 1000, 3),
                "first_byte_ms": None if first_byte_s is None else round(first_byte_s * 1000, 3),
            }
            if record is not None:
                fields["prompt_tokens"] = record.prompt_tokens
                fields["completion_tokens"] = record.completion_tokens
                fields["cost"] = str(record.cost)
            ACCESS.write(f"{entry.method} {call.endpoint} {entry.status}", fields)

    def answered(
        self, scope: Scope, status: int, code: str | None, started_ns: int, trace_id: str | None = None
    ) -> None:
        """Any other request has been answered (a refusal for the key included)."""
        endpoint = endpoint_of(scope)
        self.metrics.request(endpoint, None, status, code)
        if scope.get("path") in QUIET_PATHS or not ACCESS.enabled:
            return
        method = scope.get("method", "")
        fields = {
            "trace_id": trace_id,
            "method": method,
            "endpoint": endpoint,
            "status": status,
            "code": code,
            "duration_ms": round((time.time_ns() - started_ns) / 1e6, 3),
        }
        ACCESS.write(f"{method} {endpoint} {status}", fields)


# Where error_response notes the code of an error answer, for the middleware's count.
ERROR_CODE: Final = "gateway.error_code"

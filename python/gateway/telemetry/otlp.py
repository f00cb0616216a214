"""The optional OpenTelemetry exporter ([tracing] otlp_endpoint): each model request's spans sent
over OTLP/HTTP (protobuf) by the OpenTelemetry SDK's exporter and batch processor, which batch on a
thread of their own, retry, drop rather than grow without bound (OTEL_BSP_MAX_QUEUE_SIZE) and read
the usual OTEL_* environment variables (OTEL_EXPORTER_OTLP_HEADERS for a collector's token).

The spans are built here from what the request recorded, with the ids it already used
(telemetry.tracing): the request's server span, child of the client's, and one client span per
try upstream, each with the span id that try sent in its traceparent, so that the provider's spans
join the same tree. Only sampled traces are exported (the client's flag, or sampled when the trace
starts here). The SDK is imported only by a gateway that exports (about 14 MB a process).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Final

from ..clock import wall_ns

if TYPE_CHECKING:
    from ..context import Call
    from ..store import RequestLog, UsageRecord

log = logging.getLogger("gateway.telemetry")
TRACES_PATH: Final = "/v1/traces"
MISSING: Final = (
    "[tracing] otlp_endpoint needs the OpenTelemetry SDK and its OTLP exporter: "
    "pip install 'gateway[otlp]' (opentelemetry-sdk, opentelemetry-exporter-otlp-proto-http)"
)


def available() -> bool:
    """Whether the exporter's packages are installed."""
    import importlib.util

    try:
        return all(
            importlib.util.find_spec(name) is not None
            for name in ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http")
        )
    except ModuleNotFoundError:  # find_spec of a submodule imports its parents: none at all
        return False


def traces_url(endpoint: str) -> str:
    """The OTLP base address as OTEL_EXPORTER_OTLP_ENDPOINT gives it ("http://collector:4318"), or
    the traces URL itself."""
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith(TRACES_PATH) else endpoint + TRACES_PATH


class SpanExport:
    def __init__(self, endpoint: str, service_name: str) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope
        from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

        self._span = ReadableSpan
        self._context = SpanContext
        self._flags = TraceFlags
        self._kind = SpanKind
        self._status = Status
        self._code = StatusCode
        # OTEL_RESOURCE_ATTRIBUTES adds to the resource; the setting names the service.
        self._resource = Resource.create({"service.name": service_name})
        self._scope = InstrumentationScope("gateway")
        self._processor = BatchSpanProcessor(OTLPSpanExporter(endpoint=traces_url(endpoint)))

    def model_request(self, call: Call, entry: RequestLog, record: UsageRecord | None, ended_ns: int) -> None:
        """Hand the request's spans to the batch processor (a queue: no I/O here)."""
        trace = call.trace
        if trace is None or not trace.sampled:
            return
        trace_id = int(trace.trace_id, 16)
        flags = self._flags(int(trace.flags, 16))
        own = self._context(trace_id, int(trace.span_id, 16), is_remote=False, trace_flags=flags)
        parent = (
            self._context(trace_id, int(trace.parent_id, 16), is_remote=True, trace_flags=flags)
            if trace.parent_id
            else None
        )
        attributes: dict[str, Any] = {
            "http.request.method": entry.method,
            "http.route": call.endpoint,
            "http.response.status_code": entry.status,
            "gateway.request_id": call.request_id,
            "gateway.account_id": call.ctx.account.id,
            "gateway.key_id": call.ctx.key.id,
        }
        if call.model:
            attributes["gen_ai.request.model"] = call.model
        if entry.error_code:
            attributes["error.type"] = entry.error_code
        if record is not None:
            attributes["gen_ai.usage.input_tokens"] = record.prompt_tokens
            attributes["gen_ai.usage.output_tokens"] = record.completion_tokens
            attributes["gateway.cost_usd"] = str(record.cost)
        spans = [
            self._span(
                name=f"{entry.method} {call.endpoint}",
                context=own,
                parent=parent,
                resource=self._resource,
                attributes=attributes,
                kind=self._kind.SERVER,
                status=self._status(self._code.ERROR if entry.status >= 500 else self._code.UNSET),
                start_time=wall_ns(call.started_ns),
                end_time=ended_ns,
                instrumentation_scope=self._scope,
            )
        ]
        last = len(call.attempts) - 1
        for n, attempt in enumerate(call.attempts):
            if not attempt.span_id:  # not a try through the router (a safety check's summary)
                continue
            end = wall_ns(attempt.ended_ns) if attempt.ended_ns else ended_ns
            if n == last and attempt.error is None and call.first_byte_ns:
                end = ended_ns  # the stream it answered ran until the request's end
            tried: dict[str, Any] = {"gateway.channel": attempt.channel}
            if attempt.error:
                tried["error.type"] = attempt.error
            spans.append(
                self._span(
                    name=f"upstream {attempt.channel}",
                    context=self._context(trace_id, attempt.span_id, is_remote=False, trace_flags=flags),
                    parent=own,
                    resource=self._resource,
                    attributes=tried,
                    kind=self._kind.CLIENT,
                    status=self._status(self._code.ERROR if attempt.error else self._code.UNSET),
                    start_time=(start := wall_ns(attempt.started_ns)),
                    end_time=max(end, start),
                    instrumentation_scope=self._scope,
                )
            )
        for span in spans:
            self._processor.on_end(span)

    def shutdown(self) -> None:
        """Export what is queued (blocking: call it off the event loop) and stop the thread."""
        try:
            self._processor.shutdown()  # type: ignore[no-untyped-call]
        except Exception:  # the collector's failure must not fail a worker's stop
            log.exception("exporting the last spans failed")

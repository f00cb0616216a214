"""W3C trace context through real processes: a client's traceparent goes upstream on each try with
a span of its own, and with [tracing] otlp_endpoint the request's spans reach an OTLP collector (here
one on loopback that decodes the OTLP/HTTP protobuf the way a collector does) in one tree: the
client's span, the gateway's server span, a client span per try whose id is the one upstream saw."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from gateway.request_log import _attempts_json
from gateway.routing import Attempt
from gateway.telemetry.otlp import traces_url
from gateway.telemetry.tracing import trace
from harness import chat_model, eventually, gateway, new_key

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


@contextmanager
def collector() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """An OTLP/HTTP traces receiver: (its base URL, the spans received, as dicts)."""
    spans: list[dict[str, Any]] = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            ok = self.path == "/v1/traces" and self.headers["content-type"] == "application/x-protobuf"
            if ok:
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                for resource in request.resource_spans:
                    service = {a.key: a.value.string_value for a in resource.resource.attributes}
                    for scope in resource.scope_spans:
                        for span in scope.spans:
                            spans.append(
                                {
                                    "service": service.get("service.name"),
                                    "name": span.name,
                                    "kind": span.kind,
                                    "trace_id": span.trace_id.hex(),
                                    "span_id": span.span_id.hex(),
                                    "parent_id": span.parent_span_id.hex(),
                                    "start": span.start_time_unix_nano,
                                    "end": span.end_time_unix_nano,
                                    "attributes": {
                                        a.key: a.value.string_value or a.value.int_value
                                        for a in span.attributes
                                    },
                                }
                            )
            self.send_response(200 if ok else 400)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", spans
    finally:
        server.shutdown()
        server.server_close()


def _wait_for(spans: list[dict[str, Any]], trace_id: str, count: int) -> list[dict[str, Any]]:
    def found() -> list[dict[str, Any]] | None:
        mine = [s for s in spans if s["trace_id"] == trace_id]
        return mine if len(mine) >= count else None

    return eventually(found, 15, 0.05, what=lambda: f"{count} spans of trace {trace_id}: {spans}")


def test_spans_reach_the_collector_in_one_tree_with_the_ids_upstream_saw(
    tmp_path: Path, sim_url: str
) -> None:
    with collector() as (otlp_url, spans):
        models = chat_model("test/chat", "sim-chat", sim_url)
        tracing = f'[tracing]\notlp_endpoint = "{otlp_url}"\nservice_name = "gateway-test"\n'
        with gateway(tmp_path, models + tracing, env={"OTEL_BSP_SCHEDULE_DELAY": "100"}) as g:
            url = g.url
            key = new_key(g.settings, Decimal("10"))
            auth = {"authorization": f"Bearer {key.key}"}
            chat = {"model": "test/chat", "messages": [{"role": "user", "content": "trace me"}]}
            # Not sampled by the client: passed on, not exported.
            unsampled = "c" * 32
            quiet = httpx.post(
                url + "/v1/chat/completions",
                json=chat,
                headers={**auth, "traceparent": f"00-{unsampled}-{CLIENT_SPAN}-00"},
            )
            assert quiet.status_code == 200
            answer = httpx.post(
                url + "/v1/chat/completions",
                json=chat,
                headers={**auth, "traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"},
            )
            assert answer.status_code == 200
            # A stream without a traceparent starts a trace at the gateway.
            with httpx.stream(
                "POST", url + "/v1/chat/completions", json={**chat, "stream": True}, headers=auth
            ) as s:
                streamed_id = s.headers["x-service-request-id"]
                assert s.status_code == 200 and s.read()
            mine = _wait_for(spans, CLIENT_TRACE, 2)
            seen = httpx.get(sim_url + "/_sim/requests").json()

    server = next(s for s in mine if s["kind"] == 2)  # SPAN_KIND_SERVER
    tried = [s for s in mine if s["kind"] == 3]  # SPAN_KIND_CLIENT
    assert server["service"] == "gateway-test"
    assert server["name"] == "POST /v1/chat/completions"
    assert server["parent_id"] == CLIENT_SPAN
    assert server["attributes"]["gen_ai.request.model"] == "test/chat"
    assert server["attributes"]["http.response.status_code"] == 200
    assert server["attributes"]["gateway.request_id"] == answer.headers["x-service-request-id"]
    assert server["attributes"]["gen_ai.usage.output_tokens"] > 0
    assert key.key not in str(spans)
    assert len(tried) == 1 and tried[0]["parent_id"] == server["span_id"]
    assert server["start"] <= tried[0]["start"] <= tried[0]["end"] <= server["end"]
    # The try's span id is the one its traceparent carried upstream, in the client's trace.
    upstream = [r["traceparent"] for r in seen if CLIENT_TRACE in (r.get("traceparent") or "")]
    assert upstream == [f"00-{CLIENT_TRACE}-{tried[0]['span_id']}-01"]
    assert any(f"00-{unsampled}-" in (r.get("traceparent") or "") for r in seen)
    assert not [s for s in spans if s["trace_id"] == unsampled]
    # The stream's trace began at the gateway: a root server span and its try.
    streamed = next(s for s in spans if s["attributes"].get("gateway.request_id") == streamed_id)
    assert streamed["parent_id"] == "" and streamed["trace_id"] != CLIENT_TRACE
    assert any(s["parent_id"] == streamed["span_id"] for s in spans)


def test_the_traces_url_follows_the_otlp_endpoint_convention() -> None:
    assert traces_url("http://collector:4318") == "http://collector:4318/v1/traces"
    assert traces_url("http://collector:4318/") == "http://collector:4318/v1/traces"
    assert traces_url("https://otlp.example.com/v1/traces") == "https://otlp.example.com/v1/traces"


def test_the_request_log_keeps_an_attempts_documented_fields_not_its_span() -> None:
    tried = Attempt("main", 1_700_000_000_000, 12, span_id=7, started_ns=1, ended_ns=2)
    logged = orjson.loads(_attempts_json([tried], ()))
    assert logged == [
        {"channel": "main", "started_ms": 1_700_000_000_000, "duration_ms": 12, "error": None, "status": None}
    ]


def test_a_new_trace_has_valid_ids_and_a_client_s_keeps_its_own() -> None:
    """A draw of zeros becoming ...01 (all-zero ids are invalid) is the core's own test
    (rust/core/src/ids.rs: all_zero_draws_become_one)."""
    found = trace({"headers": []})
    assert re.fullmatch("[0-9a-f]{32}", found.trace_id) and re.fullmatch("[0-9a-f]{16}", found.span_id)
    assert (found.flags, found.parent_id) == ("01", None)
    assert trace({"headers": []}).trace_id != found.trace_id
    header = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01".encode()
    client = trace({"headers": [(b"host", b"x"), (b"traceparent", header), (b"traceparent", b"junk")]})
    assert (client.trace_id, client.parent_id, client.flags) == (CLIENT_TRACE, CLIENT_SPAN, "01")
    assert re.fullmatch("[0-9a-f]{16}", client.span_id) and client.span_id != CLIENT_SPAN
    # The first traceparent is the one read: an invalid first one starts a new trace.
    fresh = trace({"headers": [(b"traceparent", b"junk"), (b"traceparent", header)]})
    assert fresh.parent_id is None and fresh.trace_id != CLIENT_TRACE


def test_a_missing_exporter_is_a_plain_refusal_not_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the `otlp` extra no `opentelemetry` package exists at all, and find_spec of its
    submodules raises instead of answering None (review: `gateway serve` died with a traceback);
    check-config names it as serve would."""
    import importlib.util

    from gateway.config import check_config_text
    from gateway.telemetry import otlp

    def absent(name: str, package: str | None = None) -> None:
        raise ModuleNotFoundError(f"No module named {name.partition('.')[0]!r}")

    monkeypatch.setattr(importlib.util, "find_spec", absent)
    assert otlp.available() is False
    report = check_config_text('[tracing]\notlp_endpoint = "http://127.0.0.1:4318"\n', "g.toml")
    assert f"tracing.otlp_endpoint: {otlp.MISSING}" in report.problems

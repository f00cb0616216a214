"""A request's end reports to the Rust core's RequestTally in one call: its metrics, gathered and
added to prometheus_client's values in one flush (the buckets and sums must be what
prometheus_client's own observe() gives), and its request line (JSON whatever the strings in it,
times as datetime writes them)."""

from __future__ import annotations

import datetime as dt
import itertools
import json
from decimal import Decimal

import orjson
from hypothesis import example, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram

from gateway.core import CoreError, RequestTally, answer_line, log_timestamp
from gateway.pricing import format_cost
from gateway.telemetry import metrics

_ENDPOINTS = itertools.count()
_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


def _samples(histogram: object, endpoint: str) -> dict[str, float]:
    out = {}
    for family in histogram.collect():  # type: ignore[attr-defined]
        for sample in family.samples:
            if sample.labels.get("endpoint") == endpoint and sample.name.endswith(
                ("_bucket", "_sum", "_count")
            ):
                out[sample.name.rsplit("_", 1)[1] + sample.labels.get("le", "")] = sample.value
    return out


def _report(tally: RequestTally, endpoint: str, added_ns: int, **kwargs: object) -> bytes | None:
    """A plain model request that spent `added_ns` of its own beside 1 ms upstream."""
    fields: dict[str, object] = {
        "endpoint": endpoint,
        "model": None,
        "status": 200,
        "code": None,
        "total_ns": 1_000_000 + added_ns,
        "upstream_ns": 1_000_000,
        "first_byte_ns": 0,
        "attempts": [],
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "cost": None,
        "line": None,
        "now_ns": 0,
        "request_id": "req_1",
        "trace_id": None,
        "account_id": "acct_1",
        "key_id": "key_1",
        "method": "POST",
    } | kwargs
    return tally.model_request(*fields.values())  # type: ignore[arg-type]


@settings(max_examples=30, deadline=None)
@example([int(b * 1e9) for b in _BUCKETS] + [0, 5_000_000_000])  # each bound itself: its own bucket
@given(st.lists(st.integers(min_value=0, max_value=5_000_000_000), max_size=40))
def test_a_flush_adds_what_observe_would_have(added: list[int]) -> None:
    endpoint = f"/e{next(_ENDPOINTS)}"  # the metrics live as long as the process: a fresh label each time
    observer = metrics.Observer([])
    reference = Histogram("reference", "", ["endpoint"], buckets=_BUCKETS, registry=CollectorRegistry())
    for ns in added:
        _report(observer.tally, endpoint, ns)
        reference.labels(endpoint).observe(ns / 1e9)
    observer.flush()
    ours = _samples(metrics.ADDED_LATENCY, endpoint)
    theirs = _samples(reference, endpoint)
    if not added:
        assert ours == {}
        return
    assert ours.keys() == theirs.keys()
    for key, value in theirs.items():
        assert abs(ours[key] - value) < 1e-9, key
    total = sum(
        s.value
        for family in metrics.REQUESTS.collect()
        for s in family.samples
        if s.labels.get("endpoint") == endpoint and s.name.endswith("_total")
    )
    assert total == len(added)


def test_models_and_channels_outside_the_configuration_count_as_empty_labels() -> None:
    observer = metrics.Observer([("m", ["a"])])
    endpoint = f"/e{next(_ENDPOINTS)}"
    _report(observer.tally, endpoint, 1, model="m", attempts=[("a", "timeout"), ("zz", "ok")])
    _report(observer.tally, endpoint, 1, model="made-up", status=404, code="model_not_found")
    counts, _ = observer.tally.drain()
    assert ("attempts", ["m", "a", "timeout"], 1.0) in counts
    assert ("attempts", ["m", "", "ok"], 1.0) in counts
    assert ("failovers", ["m"], 1.0) in counts  # two channels tried
    assert ("requests", [endpoint, "", "404", "model_not_found"], 1.0) in counts
    assert observer.tally.drain() == ([], [])  # a drain starts afresh


def test_a_charge_counts_its_tokens_and_cost() -> None:
    tally = RequestTally([], [], [], [("m", [])])
    cost = format_cost(Decimal("0.000000138"))  # plain notation, never 1.38E-7
    line = _report(tally, "/e", 5, model="m", prompt_tokens=3, completion_tokens=4, cost=cost, line="json")
    counts, _ = tally.drain()
    assert ("tokens", ["m", "in"], 3.0) in counts and ("tokens", ["m", "out"], 4.0) in counts
    assert ("cost", ["m"], 1.38e-7) in counts
    assert line is not None and orjson.loads(line)["cost"] == "0.000000138"


_TEXT = st.text(st.characters(codec="utf-8"), max_size=30)


@settings(max_examples=200, deadline=None)
@example(("", None, "", ""), "", None, None, 100, 0, 1, 9_999_999_959_501, 0)  # CI's float error
@given(
    ids=st.tuples(_TEXT, st.none() | _TEXT, _TEXT, _TEXT),
    endpoint=_TEXT,
    model=st.none() | _TEXT,
    code=st.none() | _TEXT,
    status=st.integers(100, 599),
    total=st.integers(0, 10**13),
    upstream=st.integers(0, 10**13),
    first_byte=st.integers(0, 10**13),
    now=st.integers(0, 4 * 10**18),
)
def test_a_model_request_line_is_json_with_every_field(
    ids: tuple[str, str | None, str, str],
    endpoint: str,
    model: str | None,
    code: str | None,
    status: int,
    total: int,
    upstream: int,
    first_byte: int,
    now: int,
) -> None:
    request_id, trace_id, account_id, key_id = ids
    line = RequestTally([], [], [], []).model_request(
        endpoint, model, status, code, total, upstream, first_byte, [], 0, 0, None, "json", now,
        request_id, trace_id, account_id, key_id, "POST",
    )  # fmt: skip
    assert line is not None and line.endswith(b"\n") and line.count(b"\n") == 1
    # Read exactly: a float's own error at ten million ms passes the rounding's half a µs (CI).
    fields = json.loads(line, parse_float=Decimal)
    assert list(fields) == [
        "ts", "level", "logger", "message", "request_id", "trace_id", "account_id", "key_id",
        "method", "endpoint", "model", "status", "code", "duration_ms", "added_ms", "upstream_ms",
        "first_byte_ms",
    ]  # fmt: skip
    assert fields["message"] == f"POST {endpoint} {status}"
    assert (fields["request_id"], fields["trace_id"], fields["account_id"], fields["key_id"]) == ids
    assert (fields["endpoint"], fields["model"], fields["code"], fields["status"]) == (
        endpoint,
        model,
        code,
        status,
    )
    assert fields["ts"] == log_timestamp(now)
    half = Decimal("0.0005")
    assert abs(fields["duration_ms"] - Decimal(total) / 10**6) <= half
    if upstream:
        added = (first_byte if first_byte else total) - upstream
        assert abs(fields["added_ms"] - Decimal(added) / 10**6) <= half
        assert abs(fields["upstream_ms"] - Decimal(upstream) / 10**6) <= half
    else:
        assert fields["added_ms"] is None and fields["upstream_ms"] is None
    assert (fields["first_byte_ms"] is None) == (first_byte == 0)


@settings(max_examples=300, deadline=None)
@example(0)
@example(951_782_400_001_000_000)  # 2000-02-29
@given(st.integers(min_value=0, max_value=2**63 - 1))  # time.time_ns() fits until 2262
def test_line_times_are_what_datetime_writes(now_ns: int) -> None:
    expected = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(milliseconds=now_ns // 1_000_000)
    assert log_timestamp(now_ns) == expected.isoformat(timespec="milliseconds")


def test_an_answer_line_in_either_format() -> None:
    json_line = answer_line("json", 0, None, "GET", "/v1/models", 200, None, 1_234_567)
    assert orjson.loads(json_line) | {"ts": None} == {
        "ts": None,
        "level": "info",
        "logger": "gateway.access",
        "message": "GET /v1/models 200",
        "trace_id": None,
        "method": "GET",
        "endpoint": "/v1/models",
        "status": 200,
        "code": None,
        "duration_ms": 1.235,
    }
    text = answer_line("text", 0, None, "GET", "/v1/models", 401, "invalid_api_key", 2_000_000)
    assert text == (
        b"1970-01-01T00:00:00.000+00:00 INFO    gateway.access GET /v1/models 401 method=GET"
        b" endpoint=/v1/models status=401 code=invalid_api_key duration_ms=2.0\n"
    )


def test_an_unknown_line_format_is_refused() -> None:
    try:
        answer_line("xml", 0, None, "GET", "/", 200, None, 0)  # type: ignore[arg-type]
    except CoreError as err:
        assert "line format" in str(err)
    else:
        raise AssertionError("accepted")

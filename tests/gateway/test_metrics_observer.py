"""The Observer gathers a process's observations and adds them to prometheus_client's values in
one flush: the buckets and sums must be what prometheus_client's own observe() gives."""

from __future__ import annotations

import itertools

from hypothesis import example, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram

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


@settings(max_examples=30, deadline=None)
@example([*_BUCKETS, 0.0, 5.0])  # each bound itself: prometheus counts it in its own bucket
@given(st.lists(st.floats(min_value=0, max_value=5, allow_nan=False), max_size=40))
def test_a_flush_adds_what_observe_would_have(values: list[float]) -> None:
    assert metrics._BOUNDS[metrics.ADDED_LATENCY] == _BUCKETS
    endpoint = f"/e{next(_ENDPOINTS)}"  # the metrics live as long as the process: a fresh label each time
    observer = metrics.Observer([])
    reference = Histogram("reference", "", ["endpoint"], buckets=_BUCKETS, registry=CollectorRegistry())
    for value in values:
        observer.request(endpoint, None, 200, None, added_s=value)
        reference.labels(endpoint).observe(value)
    observer.flush()
    ours = _samples(metrics.ADDED_LATENCY, endpoint)
    theirs = _samples(reference, endpoint)
    if not values:
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
    assert total == len(values)

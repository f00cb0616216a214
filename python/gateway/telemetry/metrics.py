"""Prometheus metrics (GET /metrics, or [metrics] listen): counters and histograms updated as
requests end, gauges sampled every few seconds.

Granian runs the gateway in several worker processes and a scrape reaches one of them, so the
values live where every process sees them: with PROMETHEUS_MULTIPROC_DIR set (`gateway serve`
makes a fresh directory for each start, gateway.supervisor), prometheus_client keeps each
process's values in small memory-mapped files there and a scrape sums them (its multiprocess
mode). A worker that dies leaves its counters behind, so totals never go backwards; its live
gauges are dropped (`forget_dead_processes`). Without the variable (the app created in-process)
the values are this process's own.

Labels come only from bounded sets: endpoints are route templates, models and channels are the
configured ones (a client's made-up model name is counted as ""), codes are the error table's.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from decimal import Decimal
from pathlib import Path
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess

from ..core import RequestTally

MULTIPROC_ENV: Final = "PROMETHEUS_MULTIPROC_DIR"
CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"

# The gateway's own work is a fraction of a millisecond to a few; the upstream's is seconds.
_ADDED_BUCKETS: Final = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
_UPSTREAM_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 240)

_REGISTRY = CollectorRegistry(auto_describe=True)

REQUESTS = Counter(
    "gateway_requests",
    "Requests answered, by endpoint (route template), model, HTTP status and error code.",
    ["endpoint", "model", "status", "code"],
    registry=_REGISTRY,
)
ADDED_LATENCY = Histogram(
    "gateway_added_latency_seconds",
    "The gateway's own time in a model request: its whole time less the upstream's (for a stream,"
    " up to the first byte sent, less the model's time to its first chunk).",
    ["endpoint"],
    buckets=_ADDED_BUCKETS,
    registry=_REGISTRY,
)
UPSTREAM_LATENCY = Histogram(
    "gateway_upstream_latency_seconds",
    "Time spent waiting for the upstream in a model request, retries and failovers included (for a"
    " stream, until its first chunk).",
    ["endpoint"],
    buckets=_UPSTREAM_BUCKETS,
    registry=_REGISTRY,
)
FIRST_BYTE = Histogram(
    "gateway_stream_first_byte_seconds",
    "Streamed requests: time from the request's arrival to its first byte sent to the client.",
    ["endpoint"],
    buckets=_UPSTREAM_BUCKETS,
    registry=_REGISTRY,
)
TOKENS = Counter(
    "gateway_tokens",
    "Tokens billed, by model and direction (in: prompt, out: completion).",
    ["model", "direction"],
    registry=_REGISTRY,
)
COST = Counter(
    "gateway_cost_usd",
    "Money charged, in US dollars, by model (the ledger is exact; this is for graphs).",
    ["model"],
    registry=_REGISTRY,
)
RATE_LIMITED = Counter(
    "gateway_rate_limit_refusals",
    "Requests refused with 429 rate_limited, by the limit they hit (requests or tokens per minute).",
    ["limit"],
    registry=_REGISTRY,
)
ATTEMPTS = Counter(
    "gateway_upstream_attempts",
    "Tries of a model request on a channel, by outcome: ok, or the error code the try failed with.",
    ["model", "channel", "outcome"],
    registry=_REGISTRY,
)
FAILOVERS = Counter(
    "gateway_failovers",
    "Model requests that moved to another channel after a failed try.",
    ["model"],
    registry=_REGISTRY,
)
CHANNEL_STATE = Gauge(
    "gateway_channel_state",
    "1 for each channel's current state (healthy, busy, at_capacity, cooling_down, half_open), else 0.",
    ["model", "channel", "state"],
    multiprocess_mode="mostrecent",
    registry=_REGISTRY,
)
HOLDS = Gauge(
    "gateway_holds_outstanding",
    "Holds of running requests not yet settled or released, over every process.",
    multiprocess_mode="livesum",
    registry=_REGISTRY,
)
MONEY_HELD = Gauge(
    "gateway_money_held_usd",
    "Money those holds set aside, in US dollars.",
    multiprocess_mode="livesum",
    registry=_REGISTRY,
)
JOBS = Gauge(
    "gateway_jobs",
    "Asynchronous jobs (videos, background responses) in the store, by kind and status.",
    ["kind", "status"],
    multiprocess_mode="mostrecent",
    registry=_REGISTRY,
)
CHANNEL_STATES: Final = ("healthy", "busy", "at_capacity", "cooling_down", "half_open")


def multiprocess_dir() -> Path | None:
    value = os.environ.get(MULTIPROC_ENV)
    return Path(value) if value else None


def render() -> bytes:
    """The text exposition of every process's values."""
    directory = multiprocess_dir()
    if directory is None:
        return generate_latest(_REGISTRY)
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(directory))  # type: ignore[no-untyped-call]
    return generate_latest(registry)


def forget_dead_processes() -> None:
    """Drop the live gauges of worker processes that are gone (their counters stay)."""
    directory = multiprocess_dir()
    if directory is None:
        return
    for path in directory.glob("gauge_live*_*.db"):
        match = re.search(r"_(\d+)\.db$", path.name)
        if match is None:
            continue
        pid = int(match.group(1))
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            multiprocess.mark_process_dead(pid, str(directory))  # type: ignore[no-untyped-call]
        except PermissionError:  # alive, someone else's
            pass


# The Rust tally's names for the metrics a request's end adds to (gateway._core.RequestTally).
_COUNTERS: Final[dict[str, Counter]] = {
    "requests": REQUESTS,
    "tokens": TOKENS,
    "cost": COST,
    "attempts": ATTEMPTS,
    "failovers": FAILOVERS,
}
_HISTOGRAMS: Final[dict[str, Histogram]] = {
    "added_latency": ADDED_LATENCY,
    "upstream_latency": UPSTREAM_LATENCY,
    "first_byte": FIRST_BYTE,
}


class Observer:
    """The metrics of one process. A request's counts and observations are gathered by the Rust
    core's RequestTally (one call a request: gateway.telemetry), and added to prometheus_client's
    values once a second (`flush`, a task of the app's lifespan) and at shutdown: each of those
    values is a locked write to a shared file, about a dozen a request otherwise, a few a second
    this way. A scrape thus sees a worker's requests up to FLUSH_SECONDS late. Label children are
    cached; the tally folds models and channels outside the configuration to ""."""

    __slots__ = ("_cache", "tally")

    def __init__(self, models: Iterable[tuple[str, Iterable[str]]]) -> None:
        self.tally = RequestTally(
            list(_ADDED_BUCKETS),
            list(_UPSTREAM_BUCKETS),
            list(_UPSTREAM_BUCKETS),
            [(name, list(channels)) for name, channels in models],
        )
        self._cache: dict[tuple[object, ...], Any] = {}

    def _child(self, metric: Counter | Histogram | Gauge, *labels: str) -> Any:
        key = (id(metric), *labels)
        child = self._cache.get(key)
        if child is None:
            child = self._cache[key] = metric.labels(*labels)
        return child

    def flush(self) -> None:
        """Add what was gathered since the last flush to the shared values."""
        counts, histograms = self.tally.drain()
        for name, labels, amount in counts:
            self._child(_COUNTERS[name], *labels).inc(amount)
        for name, endpoint, buckets, total in histograms:
            child = self._child(_HISTOGRAMS[name], endpoint)
            # prometheus_client has no observe-many; its per-bucket values are what observe() adds to.
            child._sum.inc(total)
            for bucket, n in zip(child._buckets, buckets, strict=True):
                if n:
                    bucket.inc(n)

    def request(self, endpoint: str, model: str | None, status: int, code: str | None) -> None:
        """An answer that is not a model request's (those report with RequestTally.model_request)."""
        self.tally.request(endpoint, model, status, code)

    def channel_state(self, model: str, channel: str, state: str) -> None:
        for each in CHANNEL_STATES:
            self._child(CHANNEL_STATE, model, channel, each).set(1 if each == state else 0)

    def holds(self, count: int, held: Decimal) -> None:
        HOLDS.set(count)
        MONEY_HELD.set(float(held))

    def jobs(self, counts: dict[tuple[str, str], int], known: Iterable[tuple[str, str]]) -> None:
        for kind, status in {*counts, *known}:
            self._child(JOBS, kind, status).set(counts.get((kind, status), 0))

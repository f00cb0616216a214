"""The background loops while the store is away: said once an episode as a warning (and once when
it is back), not a traceback a second per loop (outage review); any other failure with its
traceback, every time."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from types import SimpleNamespace
from typing import Any

import pytest

from gateway import housekeeping
from gateway.loop_failures import QuietWhileAway
from gateway.store.postgres.errors import StoreUnavailable


def run_until(loop: Callable[[], Coroutine[Any, Any, None]], done: Callable[[], bool]) -> None:
    """Run a background loop as a task until `done()`, then cancel it."""

    async def main() -> None:
        task = asyncio.create_task(loop())
        while not done():
            await asyncio.sleep(0.005)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(main())


def test_an_outage_is_said_once_and_its_end_once(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("gateway.test_loop")
    said = QuietWhileAway(log, "polling jobs")
    with caplog.at_level(logging.INFO, logger="gateway.test_loop"):
        for _ in range(5):
            said.failed(StoreUnavailable("PostgreSQL is out of reach: refused"))
        said.succeeded()
        said.succeeded()
        said.failed(ValueError("a bug"))
        said.failed(ValueError("a bug"))
        said.failed(StoreUnavailable("PostgreSQL is out of reach: refused"))
    records = [(r.levelname, r.getMessage(), r.exc_info is not None) for r in caplog.records]
    assert records == [
        (
            "WARNING",
            "polling jobs waits: PostgreSQL is out of reach: refused (said once until it is back)",
            False,
        ),
        ("INFO", "polling jobs resumed", False),
        ("ERROR", "polling jobs failed", True),
        ("ERROR", "polling jobs failed", True),
        (
            "WARNING",
            "polling jobs waits: PostgreSQL is out of reach: refused (said once until it is back)",
            False,
        ),
    ]


def test_tending_leases_while_the_store_is_away_logs_no_traceback(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(housekeeping, "LEASE_INTERVAL_SECONDS", 0.005)
    passes = 0

    async def away() -> None:
        nonlocal passes
        passes += 1
        raise StoreUnavailable("PostgreSQL is out of reach: refused")

    state: Any = SimpleNamespace(funds=SimpleNamespace(answer_recalls=away, return_idle=away))

    with caplog.at_level(logging.INFO, logger="gateway.housekeeping"):
        run_until(lambda: housekeeping.tend_leases(state), lambda: passes >= 20)
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert caplog.records[0].exc_info is None


def test_the_gauges_say_an_outage_once_though_most_passes_never_ask_the_store(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store is asked every JOB_SAMPLE_EVERY passes: the others must not say it is back (diff
    review: a warning and a false "resumed" every 15 s)."""
    monkeypatch.setattr(housekeeping, "GAUGE_INTERVAL_SECONDS", 0.002)
    asked = 0

    async def job_counts() -> dict[tuple[str, str], int]:
        nonlocal asked
        asked += 1
        raise StoreUnavailable("PostgreSQL is out of reach: refused")

    async def report() -> dict[str, list[dict[str, str]]]:
        return {}

    funds = SimpleNamespace(open_holds=0, money_held=lambda: 0)
    metrics = SimpleNamespace(holds=lambda *_: None, channel_state=lambda *_: None, jobs=lambda *_: None)
    state: Any = SimpleNamespace(
        funds=funds,
        router=SimpleNamespace(report=report),
        store=SimpleNamespace(job_counts=job_counts),
        telemetry=SimpleNamespace(metrics=metrics),
    )

    with caplog.at_level(logging.INFO, logger="gateway.housekeeping"):
        run_until(lambda: housekeeping.sample_gauges(state), lambda: asked >= 5)
    assert [r.levelname for r in caplog.records] == ["WARNING"]

"""The background loops while the store is away: said once an episode as a warning (and once when
it is back), not a traceback a second per loop (outage review); any other failure with its
traceback, every time."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from gateway import housekeeping
from gateway.loop_failures import QuietWhileAway
from gateway.store.postgres.errors import StoreUnavailable


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

    async def main() -> None:
        task = asyncio.create_task(housekeeping.tend_leases(state))
        while passes < 20:
            await asyncio.sleep(0.01)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    with caplog.at_level(logging.INFO, logger="gateway.housekeeping"):
        asyncio.run(main())
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert caplog.records[0].exc_info is None

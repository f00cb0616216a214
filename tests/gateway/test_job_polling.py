"""How jobs are followed (gateway.jobs): one slow upstream holds up no other job, and a reload that
renames or reorders a model's channels keeps each running job on the channel it started on."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gateway import jobs
from gateway.config import parse_settings


class Store:
    """Hands out the due jobs once each, as claim_jobs does."""

    def __init__(self, due: list[str]) -> None:
        self.due = due

    async def claim_jobs(self, now_ms: int, lease_ms: int, limit: int) -> list[Any]:
        taken, self.due = self.due[:limit], self.due[limit:]
        return [SimpleNamespace(id=i, kind="video") for i in taken]


def test_a_hanging_upstream_holds_up_no_other_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """Polls run POLL_BATCH at a time, each slot taking the next due job when its poll ends: a job
    whose upstream hangs does not keep the others waiting for it (they used to wait for their
    whole batch, and the batch for its slowest poll, up to the synchronous window)."""
    started: dict[str, float] = {}

    async def poll(state: Any, kind: Any, job: Any) -> None:
        started[job.id] = time.monotonic()
        await asyncio.sleep(2.0 if job.id == "hangs" else 0.01)

    monkeypatch.setattr(jobs, "poll", poll)
    due = ["hangs"] + [f"quick{i}" for i in range(3 * jobs.POLL_BATCH)]
    state = SimpleNamespace(store=Store(due))
    began = time.monotonic()
    polled = asyncio.run(jobs.poll_due(state, {"video": None}))  # type: ignore[arg-type, dict-item]
    assert polled == len(due)
    assert max(t - began for job, t in started.items() if job != "hangs") < 1.0


def test_polls_cut_short_let_their_jobs_go(monkeypatch: pytest.MonkeyPatch) -> None:
    """CI: a worker stopped mid-poll (a reload) kept its jobs claimed for the lease's minute, and a
    render waited that long for another process to poll it. Cancelled, the polls' jobs are let go
    at once (Store.release_jobs); jobs already polled are not named."""
    released: list[list[str]] = []

    class Releasing(Store):
        async def release_jobs(self, job_ids: list[str]) -> None:
            released.append(sorted(job_ids))

    async def poll(state: Any, kind: Any, job: Any) -> None:
        await asyncio.sleep(0 if job.id == "quick" else 60)

    monkeypatch.setattr(jobs, "poll", poll)
    state = SimpleNamespace(store=Releasing(["quick", "slow1", "slow2"]))

    async def stopped() -> None:
        task = asyncio.create_task(jobs.poll_due(state, {"video": None}))  # type: ignore[arg-type, dict-item]
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(stopped())
    assert released == [["slow1", "slow2"]]


def test_a_claim_under_way_when_the_worker_stops_lets_its_jobs_go(monkeypatch: pytest.MonkeyPatch) -> None:
    """The claim's write goes on in the store when its worker stops (SQLite's writer thread, a
    statement sent to PostgreSQL): the jobs it claimed are let go too, not held for a minute."""
    released: list[list[str]] = []

    class SlowClaim(Store):
        async def claim_jobs(self, now_ms: int, lease_ms: int, limit: int) -> list[Any]:
            await asyncio.sleep(0.3)  # the worker is stopped meanwhile; the claim still commits
            return await super().claim_jobs(now_ms, lease_ms, limit)

        async def release_jobs(self, job_ids: list[str]) -> None:
            released.append(sorted(job_ids))

    state = SimpleNamespace(store=SlowClaim(["a", "b"]))

    async def stopped() -> None:
        task = asyncio.create_task(jobs.poll_due(state, {"video": None}))  # type: ignore[arg-type, dict-item]
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(stopped())
    assert released == [["a", "b"]]


def settings(channels: list[dict[str, Any]]) -> Any:
    model = {"name": "openai/sora-2", "type": "video", "channels": channels}
    return parse_settings({"models": [model]}, Path("/tmp")).models[0]


def test_a_reload_that_renames_or_reorders_channels_keeps_each_job_on_its_own() -> None:
    first = {"provider": "openai", "base_url": "https://one.example/v1", "model": "sora-2"}
    second = {"provider": "openai", "base_url": "https://two.example/v1", "model": "sora-2"}
    before = settings([first, second])
    started_on = [c.identity for c in before.channels]  # what a job records
    # A channel added ahead of both, and both named: their places and names all change.
    standby = {
        "provider": "openai",
        "base_url": "https://standby.example/v1",
        "model": "sora-2",
        "priority": 5,
    }
    after = settings([standby, {**second, "name": "backup"}, {**first, "name": "primary"}])
    found = [jobs.channel_of(after, identity) for identity in started_on]
    assert [c.base_url if c else None for c in found] == ["https://one.example/v1", "https://two.example/v1"]
    # A job recorded by name (before identities) is still found by it while the name stands.
    assert jobs.channel_of(before, "openai-1") is before.channels[1]
    # Pointed elsewhere, the channel is another one: the job is not sent there.
    moved = settings([{**first, "base_url": "https://elsewhere.example/v1"}])
    assert jobs.channel_of(moved, started_on[0]) is None

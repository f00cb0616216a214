"""Background upkeep of one gateway process: deleting what has expired (served images, response
states, request log bodies), giving idle leases back and reclaiming what dead processes left
(gateway.funds). Runs as tasks of the app's lifespan; each worker runs them, and a pass that finds
nothing costs an index lookup or a directory listing."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from .clock import now_ms
from .console.security import IDLE_MS
from .loop_failures import QuietWhileAway
from .state import GatewayState
from .telemetry.metrics import forget_dead_processes

# Expired rows are deleted at least this often (more often when image URLs live shorter).
PURGE_INTERVAL_SECONDS = 60.0
# Recalled leases are answered and idle ones go back this often (gateway.funds); dead processes'
# journals and leases are reclaimed every RECLAIM_EVERY passes.
LEASE_INTERVAL_SECONDS = 1.0
RECLAIM_EVERY = 10
# The metrics' gauges are sampled this often; the store's jobs every JOB_SAMPLE_EVERY samples.
GAUGE_INTERVAL_SECONDS = 5.0
JOB_SAMPLE_EVERY = 3
# A worker's requests reach GET /metrics at most this late (gateway.telemetry.metrics.Observer).
METRICS_FLUSH_SECONDS = 1.0
log = logging.getLogger("gateway.housekeeping")


async def purge_expired(state: GatewayState) -> None:
    interval = min(PURGE_INTERVAL_SECONDS, state.settings.image_url_ttl_seconds)
    retention_ms = int(state.settings.log_body_retention_days * 86_400_000)
    purges: dict[str, Callable[[int], Awaitable[int]]] = {
        "images": state.store.purge_images,
        "response states": state.store.purge_responses,
        "request log bodies": lambda now: state.store.purge_log_bodies(now - retention_ms),
        "idempotency entries": state.store.purge_idempotency,
        "video files": state.store.purge_video_files,
        "console sessions": lambda now: state.store.purge_console_sessions(now, IDLE_MS),
    }
    said = {what: QuietWhileAway(log, f"purging expired {what}") for what in purges}
    while True:
        await asyncio.sleep(interval)
        now = now_ms()
        for what, purge in purges.items():
            try:
                await purge(now)
            except Exception as exc:  # retried at the next tick; the task must not die
                said[what].failed(exc)
            else:
                said[what].succeeded()


async def tend_leases(state: GatewayState) -> None:
    passes = 0
    said = QuietWhileAway(log, "tending leases")
    while True:
        await asyncio.sleep(LEASE_INTERVAL_SECONDS)
        passes += 1
        try:
            await state.funds.answer_recalls()  # first: a request elsewhere may be waiting on it
            await state.funds.return_idle()
            if passes % RECLAIM_EVERY == 0:
                await state.store.reclaim_orphans()
        except Exception as exc:  # retried at the next tick; the task must not die
            said.failed(exc)
        else:
            said.succeeded()


async def flush_metrics(state: GatewayState) -> None:
    """The requests' metrics, gathered in this process, into the shared values (Observer.flush)."""
    while True:
        await asyncio.sleep(METRICS_FLUSH_SECONDS)
        try:
            state.telemetry.metrics.flush()
        except Exception:  # flushed again at the next tick; the task must not die
            log.exception("flushing the metrics failed")


async def sample_gauges(state: GatewayState) -> None:
    """The metrics' gauges (gateway.telemetry.metrics), sampled rather than kept up by every
    request: this process's holds, the channels' states, the store's jobs by kind and status."""
    metrics = state.telemetry.metrics
    seen_jobs: set[tuple[str, str]] = set()
    passes = 0
    said = QuietWhileAway(log, "sampling the metrics' gauges")
    while True:
        try:
            forget_dead_processes()
            metrics.holds(state.funds.open_holds, state.funds.money_held())
            for model, channels in (await state.router.report()).items():
                for channel in channels:
                    metrics.channel_state(model, channel["name"], channel["state"])
            if passes % JOB_SAMPLE_EVERY == 0:
                counts = await state.store.job_counts()
                seen_jobs.update(counts)
                metrics.jobs(counts, seen_jobs)
                said.succeeded()  # only a pass that asked the store can say it is back
        except Exception as exc:  # sampled again at the next tick; the task must not die
            said.failed(exc)
        passes += 1
        await asyncio.sleep(GAUGE_INTERVAL_SECONDS)

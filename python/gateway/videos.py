"""Asynchronous video jobs (spec 2.2, 3.1, 1.4.4): the gateway's side of an upstream's video job.

Creating a job holds its estimated cost (seconds asked for, at the model's per-second price) like any
request, sends the job to a channel (gateway.routing) and records it; in the same store transaction
the hold moves from this process's lease to a lease of the job's own, so it outlives the process
that placed it. From then on the job is driven by `drive_jobs`, a task in every worker process:
jobs due for a poll are leased to one process at a time, which asks the upstream for the job's
state. A completed job's file is fetched and kept for `[videos] file_ttl_seconds`, the job is
charged its actual cost and its hold goes back, in one transaction; a failed one (or one the
upstream lost, or one unfinished after `[videos] max_job_seconds`) releases its hold and is not
charged. A restarted gateway picks its jobs up where they were: their state and holds are in the
store, and their poll leases run out.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any, Final

import orjson

from .clock import now_ms
from .config import ChannelConfig, ModelConfig
from .errors import GatewayError
from .pricing import Usage, cost
from .providers import PROVIDERS
from .providers.base import read_capped, upstream_error
from .providers.http import UPSTREAM_FAILURES
from .state import GatewayState
from .store import UsageRecord, VideoJob

log = logging.getLogger("gateway.videos")

DEFAULT_SECONDS: Final = "4"  # what OpenAI renders when a request names no length
# A process polling a job holds it this long at most; a process that dies mid-poll lets it go then.
POLL_LEASE_MS: Final = 60_000
# Polled together; each may be fetching a file of up to MAX_VIDEO_BYTES into memory.
POLL_BATCH: Final = 4
MAX_VIDEO_BYTES: Final = 256 * 1024 * 1024
UPSTREAM_STATES: Final = frozenset({"queued", "in_progress", "completed", "failed"})


def estimate(seconds: str) -> Usage:
    """What a job of this length is expected to use: priced per second of video."""
    return Usage(seconds=int(seconds))


def job_object(job: VideoJob, content_url: str | None) -> dict[str, Any]:
    """The job as OpenAI's Video object, with where to download it once completed (spec 2.2)."""
    completed = job.status == "completed"
    return {
        "id": job.id,
        "object": "video",
        "created_at": job.created_at_ms // 1000,
        "completed_at": None if job.completed_at_ms is None else job.completed_at_ms // 1000,
        "expires_at": None if job.expires_at_ms is None else job.expires_at_ms // 1000,
        "status": job.status,
        "model": job.model,
        "progress": job.progress,
        "prompt": job.prompt,
        "seconds": job.seconds,
        "size": job.size,
        "error": None if job.error is None else orjson.loads(job.error),
        "remixed_from_video_id": None,
        "download_url": content_url if completed else None,
    }


async def drive_jobs(state: GatewayState) -> None:
    """Poll every unfinished job when it is due, forever (a task of every worker process)."""
    pause = min(1.0, state.settings.videos.poll_seconds / 2)
    while True:
        try:
            await poll_due(state)
        except Exception:
            log.exception("polling video jobs failed; trying again")
        await asyncio.sleep(pause)


async def poll_due(state: GatewayState) -> int:
    """Poll the jobs due now, a batch at a time; returns how many were polled."""
    polled = 0
    while True:
        jobs = await state.store.claim_video_jobs(now_ms(), POLL_LEASE_MS, POLL_BATCH)
        if not jobs:
            return polled
        await asyncio.gather(*(poll(state, job) for job in jobs))
        polled += len(jobs)


async def poll(state: GatewayState, job: VideoJob) -> None:
    """Ask the upstream how the job is going, and move it on."""
    model = state.registry.get(job.model)
    channel = _channel(model, job.channel)
    if model is None or channel is None:
        await fail(state, job, "model_removed", "The video model is no longer configured.")
        return
    try:
        answer = await _get_json(state, channel, f"/videos/{job.upstream_id}")
    except GatewayError as err:
        if err.status == 404:
            await fail(state, job, "video_generation_failed", "The model's provider lost the job.")
        elif now_ms() - job.created_at_ms > _max_age_ms(state):
            await fail(state, job, "timeout", "The job did not finish in time.")
        else:  # the upstream is unwell for now: ask again at the next poll
            await _later(state, job, job.status, job.progress)
        return
    status = answer.get("status")
    if status == "failed":
        error = answer.get("error")
        code, message = "video_generation_failed", "The render failed."
        if isinstance(error, dict):
            code = error["code"] if isinstance(error.get("code"), str) else code
            message = error["message"] if isinstance(error.get("message"), str) else message
        await fail(state, job, code, message)
    elif status == "completed":
        await _complete(state, job, model, channel, answer)
    elif now_ms() - job.created_at_ms > _max_age_ms(state):
        await fail(state, job, "timeout", "The job did not finish in time.")
    else:
        progress = answer.get("progress")
        await _later(
            state,
            job,
            status if status in UPSTREAM_STATES else job.status,
            min(99, max(0, progress)) if isinstance(progress, int) else job.progress,
        )


async def fail(state: GatewayState, job: VideoJob, code: str, message: str) -> None:
    """End the job failed: its hold goes back, nothing is charged."""
    error = orjson.dumps({"code": code, "message": message}).decode()
    await state.store.finish_video_job(
        job.id, error=error, record=None, content=None, content_type=None, now_ms=now_ms(), ttl_ms=0
    )


async def _complete(
    state: GatewayState, job: VideoJob, model: ModelConfig, channel: ChannelConfig, answer: dict[str, Any]
) -> None:
    try:
        content, content_type = await _get(
            state, channel, f"/videos/{job.upstream_id}/content", MAX_VIDEO_BYTES
        )
    except GatewayError as err:
        if err.code == "not_found" or now_ms() - job.created_at_ms > _max_age_ms(state):
            await fail(state, job, "video_generation_failed", "The model's file could not be fetched.")
        else:
            await _later(state, job, "in_progress", job.progress)  # fetched at the next poll
        return
    seconds = answer.get("seconds")
    reported = int(seconds) if isinstance(seconds, str) and seconds.isdigit() else int(job.seconds)
    # Never more than was asked for, and held.
    rendered = min(reported, int(job.seconds))
    ended = now_ms()
    record = UsageRecord(
        id=job.id,
        request_id=job.request_id,
        key_id=job.key_id,
        account_id=job.account_id,
        model=job.model,
        status="completed",
        prompt_tokens=0,
        completion_tokens=0,
        cost=cost(model.prices, Usage(seconds=rendered)),
        started_at_ms=job.created_at_ms,
        ended_at_ms=ended,
    )
    await state.store.finish_video_job(
        job.id,
        error=None,
        record=record,
        content=content,
        content_type=content_type,
        now_ms=ended,
        ttl_ms=math.ceil(state.settings.videos.file_ttl_seconds * 1000),
    )


def _max_age_ms(state: GatewayState) -> float:
    """How old a job may get before it is failed and its hold released."""
    return state.settings.videos.max_job_seconds * 1000


async def _later(state: GatewayState, job: VideoJob, status: str, progress: int) -> None:
    due = now_ms() + math.ceil(state.settings.videos.poll_seconds * 1000)
    await state.store.note_video_progress(job.id, status, progress, due)


def _channel(model: ModelConfig | None, name: str) -> ChannelConfig | None:
    return None if model is None else next((c for c in model.channels if c.name == name), None)


async def _get_json(state: GatewayState, channel: ChannelConfig, path: str) -> dict[str, Any]:
    body, _ = await _get(state, channel, path, 1024 * 1024)
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise GatewayError("provider_error", "The model's provider sent a malformed answer.") from exc
    if not isinstance(answer, dict):
        raise GatewayError("provider_error", "The model's provider sent a malformed answer.")
    return answer


async def _get(state: GatewayState, channel: ChannelConfig, path: str, limit: int) -> tuple[bytes, str]:
    """GET from the channel's upstream with its credentials: the body (at most `limit` bytes) and
    its content type, or the spec's error for the upstream's failure (not_found: the upstream has
    no such job)."""
    provider = PROVIDERS[channel.provider]
    headers = provider.headers(channel, {})
    headers.pop("content-type", None)
    timeout = state.settings.sync_timeout_seconds
    try:
        async with asyncio.timeout(timeout):
            response = await state.upstream.get(channel.base_url + path, timeout, headers)
            try:
                if response.status == 404:
                    raise GatewayError("not_found", "The model's provider has no such job.")
                if response.status >= 400:
                    raise upstream_error(
                        response.status, await response.read(), response.headers.get("retry-after")
                    )
                content = await read_capped(response, limit, "file")
                return content, response.headers.get("content-type", "application/octet-stream")
            finally:
                response.release()
    except (TimeoutError, *UPSTREAM_FAILURES) as exc:
        raise GatewayError("provider_error", "The model's provider could not be reached.") from exc

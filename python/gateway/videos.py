"""Asynchronous video jobs (spec 2.2, 3.1, 1.4.4): the video kind of gateway.jobs.

A job's estimated cost is the seconds asked for at the model's per-second price. Once the upstream
reports it completed, its file is fetched and kept for `[videos] file_ttl_seconds`, and the job is
charged the seconds rendered (never more than were asked for and held), in one transaction; a
failed render releases the hold and is not charged.
"""

from __future__ import annotations

import math
from typing import Any, Final

import orjson

from . import billing, jobs
from .clock import now_ms
from .config import ChannelConfig, ModelConfig
from .errors import GatewayError
from .pricing import Usage
from .state import GatewayState
from .store import Job

DEFAULT_SECONDS: Final = "4"  # what OpenAI renders when a request names no length
MAX_VIDEO_BYTES: Final = 256 * 1024 * 1024
UPSTREAM_STATES: Final = frozenset({"queued", "in_progress", "completed", "failed"})


def estimate(seconds: str) -> Usage:
    """What a job of this length is expected to use: priced per second of video."""
    return Usage(seconds=int(seconds))


def job_object(job: Job, content_url: str | None) -> dict[str, Any]:
    """The job as OpenAI's Video object, with where to download it once completed (spec 2.2), until
    the file expires (its `expires_at` says when: past it, the download is 404)."""
    expired = job.expires_at_ms is not None and job.expires_at_ms <= now_ms()
    completed = job.status == "completed" and not expired
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


async def advance(
    state: GatewayState,
    job: Job,
    model: ModelConfig,
    channel: ChannelConfig,
    answer: dict[str, Any],
    raw: bytes,
) -> None:
    """Act on the upstream's Video object (gateway.jobs.JobKind.advance)."""
    status = answer.get("status")
    status = status if isinstance(status, str) else None  # any JSON value, a list too (unhashable)
    if status == "failed":
        await jobs.fail(
            state, job, *jobs.reported_error(answer, "video_generation_failed", "The render failed.")
        )
    elif status == "completed":
        await _complete(state, job, model, channel, answer)
    elif jobs.too_old(state, job):
        await jobs.fail(state, job, "timeout", "The job did not finish in time.")
    else:
        progress = answer.get("progress")
        await jobs.later(
            state,
            job,
            status if status in UPSTREAM_STATES else job.status,
            min(99, max(0, progress)) if isinstance(progress, int) else job.progress,
        )


KIND: Final = jobs.JobKind("/videos", advance)


async def _complete(
    state: GatewayState, job: Job, model: ModelConfig, channel: ChannelConfig, answer: dict[str, Any]
) -> None:
    try:
        content, content_type = await jobs.get(
            state, channel, f"/videos/{job.upstream_id}/content", MAX_VIDEO_BYTES
        )
    except GatewayError as err:
        if err.code == "not_found" or jobs.too_old(state, job):
            await jobs.fail(state, job, "video_generation_failed", "The model's file could not be fetched.")
        else:
            await jobs.later(state, job, "in_progress", job.progress)  # fetched at the next poll
        return
    asked = int(job.seconds or DEFAULT_SECONDS)
    seconds = answer.get("seconds")
    reported = int(seconds) if isinstance(seconds, str) and seconds.isdigit() else asked
    rendered = min(reported, asked)  # never more than was asked for, and held
    ended = now_ms()
    record = billing.job_usage_record(job, model, "completed", Usage(seconds=rendered), ended)
    await state.store.finish_job(
        job.id,
        "completed",
        error=None,
        record=record,
        now_ms=ended,
        content=content,
        content_type=content_type,
        ttl_ms=math.ceil(state.settings.videos.file_ttl_seconds * 1000),
    )

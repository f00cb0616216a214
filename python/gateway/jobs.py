"""Asynchronous jobs (spec 1.4.4): work an upstream runs in the background while the client polls
the gateway. Two kinds: video jobs (gateway.videos) and background responses, as deep research runs
(gateway.background). This module is what they share.

Creating a job (`record`) holds its estimated cost like any request, and once the upstream has
accepted the job, the hold moves from this process's lease to a lease of the job's own, in the same
store transaction that records the job, so it outlives the process that placed it. From then on the
job is driven by `drive_jobs`, a task in every worker process: jobs due for a poll are leased to one
process at a time, which asks the upstream for the job's state and hands the answer to the job's
kind (`JobKind.advance`), which ends the job or notes its progress. A job ends exactly once
(Store.finish_job is guarded by its status): charged its actual cost, or failed and charged nothing,
and either way its hold goes back. A job the upstream lost, or one unfinished after its kind's
`max_job_seconds`, fails. A restarted gateway picks its jobs up where they were: their state and
holds are in the store, and their poll leases run out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson
from starlette.responses import Response

from . import billing, idempotency
from .clock import now_ms
from .config import ChannelConfig, JobSettings, ModelConfig, Settings
from .context import Call
from .errors import GatewayError
from .loop_failures import QuietWhileAway
from .providers import PROVIDERS, resource_url
from .providers.base import is_success, read_capped, send, upstream_error
from .providers.http import UPSTREAM_FAILURES
from .state import GatewayState
from .store import Job

log = logging.getLogger("gateway.jobs")

# A process polling a job holds it this long at most; a process that dies mid-poll lets it go then.
POLL_LEASE_MS: Final = 60_000
# How long a job's state may take to come back (a small JSON object): well within the lease, so
# that no other process polls the job meanwhile. An upstream that hangs longer is asked again at
# the next poll. (A finished video's download may take up to [limits] sync_timeout_seconds; past
# the lease another process may download it too, and the job still ends once: Store.finish_job.)
STATE_TIMEOUT_SECONDS: Final = 30.0
# Polled at once, each as soon as a slot is free; each may be fetching a video of up to
# videos.MAX_VIDEO_BYTES into memory.
POLL_BATCH: Final = 4
MAX_STATE_BYTES: Final = 16 * 1024 * 1024  # a job's state as the upstream reports it
# While polls run and no other job is due, how often to look for jobs that have come due.
CLAIM_AGAIN_SECONDS: Final = 1.0


@dataclass(frozen=True, slots=True)
class JobKind:
    """What differs between kinds of job."""

    path: str  # the upstream's collection of such jobs, relative to the channel's base URL
    # advance(state, job, model, channel, answer, raw): act on the upstream's report of the job
    # (`answer`, parsed from the bytes `raw`): end it, or note its progress with `later`.
    advance: Callable[[GatewayState, Job, ModelConfig, ChannelConfig, dict[str, Any], bytes], Awaitable[None]]


async def record(state: GatewayState, call: Call, job: Job, answer: Response | None = None) -> None:
    """Record a job the upstream has accepted, its hold (the request's) now the job's own, with
    `answer` kept for the request's Idempotency-Key in the same step (a retry after a killed process
    replays it instead of starting a second job)."""
    kept = None if answer is None else idempotency.kept_response(call, answer)
    # Taken off this process's lease in memory first, so that a request cancelled while the write
    # commits (it commits regardless) cannot leave the in-memory lease above the store's.
    await state.store.create_job(job, billing.hand_over_to_job(state, call), kept)
    if kept is not None:
        idempotency.taken(call)


async def drive_jobs(state: GatewayState, kinds: Mapping[str, JobKind]) -> None:
    """Poll every unfinished job when it is due, forever (a task of every worker process)."""
    pause = min(1.0, *(settings_of(state.settings, kind).poll_seconds / 2 for kind in kinds))
    said = QuietWhileAway(log, "polling jobs")
    while True:
        try:
            await poll_due(state, kinds)
        except Exception as exc:  # tried again after the pause
            said.failed(exc)
        else:
            said.succeeded()
        await asyncio.sleep(pause)


async def poll_due(state: GatewayState, kinds: Mapping[str, JobKind]) -> int:
    """Poll the jobs due now, POLL_BATCH at a time, each slot taking the next due job as soon as
    its poll ends (one slow upstream holds up no job of another); returns how many were polled."""
    polled = 0
    running: set[asyncio.Task[None]] = set()
    claimed: dict[asyncio.Task[None], str] = {}  # each running poll's job
    claiming: asyncio.Future[list[Job]] | None = None
    try:
        while True:
            room = POLL_BATCH - len(running)
            jobs: list[Job] = []
            if room:
                # Shielded: a claim under way when the worker stops still commits (the store's
                # write goes on), and its jobs are let go below with the polls'.
                claiming = asyncio.ensure_future(state.store.claim_jobs(now_ms(), POLL_LEASE_MS, room))
                jobs = await asyncio.shield(claiming)
                claiming = None
            for job in jobs:
                task = asyncio.create_task(poll(state, kinds[job.kind], job))
                running.add(task)
                claimed[task] = job.id
            polled += len(jobs)
            if not running:
                return polled
            if len(jobs) < room or not room:  # nothing more due now: wait for a slot, or a while
                done, running = await asyncio.wait(
                    running, timeout=CLAIM_AGAIN_SECONDS, return_when=asyncio.FIRST_COMPLETED
                )
                for task in done:
                    claimed.pop(task, None)
                    if not task.cancelled() and task.exception() is not None:
                        log.error("polling a job failed", exc_info=task.exception())
    finally:
        await _let_go(state, running, [claimed[task] for task in running], claiming)


async def _let_go(
    state: GatewayState,
    running: set[asyncio.Task[None]],
    polled: list[str],
    claiming: asyncio.Future[list[Job]] | None,
) -> None:
    """Polls cut short (the worker stopping: a reload, a shutdown) and a claim under way let their
    jobs go at once, for another process to poll now, not once the claim's minute has run out (a
    reload held a render back for up to a minute; CI's test_videos found it)."""
    for task in running:
        task.cancel()
    await asyncio.gather(*running, return_exceptions=True)
    if claiming is not None:
        with contextlib.suppress(Exception):
            polled += [job.id for job in await claiming]
    if not polled:
        return
    try:
        await state.store.release_jobs(polled)
    except Exception:  # the store away too: the claims lapse with their lease
        log.warning("stopping, %d polled jobs could not be let go", len(polled), exc_info=True)


async def poll(state: GatewayState, kind: JobKind, job: Job) -> None:
    """Ask the upstream how the job is going, and move it on."""
    model = state.registry.get(job.model)
    channel = channel_of(model, job.channel)
    if model is None or channel is None:
        await fail(state, job, "model_removed", "The model is no longer configured.")
        return
    try:
        raw, _ = await get(
            state, channel, f"{kind.path}/{job.upstream_id}", MAX_STATE_BYTES, STATE_TIMEOUT_SECONDS
        )
        answer = json_object(raw)
    except GatewayError as err:
        if err.code == "not_found":
            await fail(state, job, "job_lost", "The model's provider lost the job.")
        elif too_old(state, job):
            await fail(state, job, "timeout", "The job did not finish in time.")
        else:  # the upstream is unwell for now: ask again at the next poll
            await later(state, job, job.status, job.progress)
        return
    await kind.advance(state, job, model, channel, answer, raw)


def settings_of(settings: Settings, kind: str) -> JobSettings:
    """How jobs of this kind are followed: [videos] for videos, [background] for responses."""
    return settings.videos if kind == "video" else settings.background


def too_old(state: GatewayState, job: Job) -> bool:
    """Whether the job has run past its kind's max_job_seconds: it fails and its hold goes back."""
    return now_ms() - job.created_at_ms > settings_of(state.settings, job.kind).max_job_seconds * 1000


async def later(state: GatewayState, job: Job, status: str, progress: int, body: bytes | None = None) -> None:
    """The job runs on: note what the upstream said, and poll it again after the kind's interval."""
    due = now_ms() + math.ceil(settings_of(state.settings, job.kind).poll_seconds * 1000)
    await state.store.note_job_progress(job.id, status, progress, due, body)


async def fail(state: GatewayState, job: Job, code: str, message: str, body: bytes | None = None) -> None:
    """End the job failed: its hold goes back, nothing is charged. A job that keeps the object its
    client reads (a response) gets it marked failed with the same error, unless `body` is given."""
    error = {"code": code, "message": message}
    if body is None and job.body is not None:
        body = orjson.dumps({**orjson.loads(job.body), "status": "failed", "error": error})
    await state.store.finish_job(
        job.id, "failed", error=orjson.dumps(error).decode(), record=None, now_ms=now_ms(), body=body
    )


def reported_error(answer: dict[str, Any], code: str, message: str) -> tuple[str, str]:
    """The (code, message) of a failed job as its upstream reports them, else the ones given."""
    error = answer.get("error")
    if isinstance(error, dict):
        code = error["code"] if isinstance(error.get("code"), str) else code
        message = error["message"] if isinstance(error.get("message"), str) else message
    return code, message


def channel_of(model: ModelConfig | None, channel: str) -> ChannelConfig | None:
    """The model's channel a job runs on (its identity, or its name for a job recorded before
    identities), if both are still configured. A reload that renames the channel, or adds or
    reorders channels, keeps it; one that changes where it points (its provider, base_url, model,
    key setting, region, project, location or API version) does not: the job is elsewhere."""
    if model is None:
        return None
    return next((c for c in model.channels if c.identity == channel), None) or next(
        (c for c in model.channels if c.name == channel), None
    )


def json_object(raw: bytes) -> dict[str, Any]:
    """An upstream's answer, which must be a JSON object."""
    try:
        answer = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise GatewayError("provider_error", "The model's provider sent a malformed answer.") from exc
    if not isinstance(answer, dict):
        raise GatewayError("provider_error", "The model's provider sent a malformed answer.")
    return answer


async def get(
    state: GatewayState, channel: ChannelConfig, path: str, limit: int, timeout: float | None = None
) -> tuple[bytes, str]:
    """GET from the channel's upstream with its credentials: the body (at most `limit` bytes) and
    its content type, or the spec's error for the upstream's failure (not_found: the upstream has
    no such job), within `timeout` (default: [limits] sync_timeout_seconds)."""
    provider = PROVIDERS[channel.provider]
    url = resource_url(channel, path)
    headers = await provider.headers(channel, {}, state.upstream, url=url)
    headers.pop("content-type", None)
    if timeout is None or timeout > state.settings.sync_timeout_seconds:
        timeout = state.settings.sync_timeout_seconds
    try:
        async with asyncio.timeout(timeout):
            response = await state.upstream.get(url, timeout, headers)
            try:
                if response.status == 404:
                    raise GatewayError("not_found", "The model's provider has no such job.")
                if not is_success(response.status):
                    raise upstream_error(
                        response.status, await response.read(), response.headers.get("retry-after"), headers
                    )
                content = await read_capped(response, limit, "file")
                return content, response.headers.get("content-type", "application/octet-stream")
            finally:
                response.release()
    except (TimeoutError, *UPSTREAM_FAILURES) as exc:
        raise GatewayError("provider_error", "The model's provider could not be reached.") from exc


async def delete(state: GatewayState, channel: ChannelConfig, path: str) -> None:
    """DELETE on the channel's upstream with its credentials (a stored response): done when it
    answers 2xx, or 404 (it holds nothing by that id now); the spec's error for its failure."""
    provider = PROVIDERS[channel.provider]
    url = resource_url(channel, path)
    headers = await provider.headers(channel, {}, state.upstream, url=url)
    headers.pop("content-type", None)
    timeout = state.settings.sync_timeout_seconds
    try:
        async with asyncio.timeout(timeout):
            response = await state.upstream.delete(url, timeout, headers)
            try:
                answer = await read_capped(response, MAX_STATE_BYTES, "answer")
            finally:
                response.release()
    except (TimeoutError, *UPSTREAM_FAILURES) as exc:
        raise GatewayError("provider_error", "The model's provider could not be reached.") from exc
    if not is_success(response.status) and response.status != 404:
        raise upstream_error(response.status, answer, response.headers.get("retry-after"), headers)


async def post(state: GatewayState, channel: ChannelConfig, path: str) -> bytes:
    """POST an empty request to the channel's upstream (an action on a job, as cancel): its answer."""
    provider = PROVIDERS[channel.provider]
    timeout = state.settings.sync_timeout_seconds
    url = resource_url(channel, path)
    try:
        async with asyncio.timeout(timeout):
            response = await send(
                state.upstream,
                url,
                b"{}",
                await provider.headers(channel, {}, state.upstream, url=url, body=b"{}"),
                stream=False,
                read_timeout=timeout,
            )
            try:
                return await read_capped(response, MAX_STATE_BYTES, "answer")
            finally:
                response.release()
    except (TimeoutError, *UPSTREAM_FAILURES) as exc:
        raise GatewayError("provider_error", "The model's provider could not be reached.") from exc

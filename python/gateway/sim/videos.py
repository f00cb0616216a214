"""The simulator's OpenAI Videos API (Sora): asynchronous video jobs, kept in memory.

POST /v1/videos creates a job and answers at once with it `queued`, as the real API does; the job's
status is then a function of the time since its creation, so polling needs no background task: queued
for the first fifth of its render time (directive `render=D`, default 2s), then in_progress with a
rising progress, then completed, or failed under the directive `render_fail`. A completed job's content
is a real MP4 (sim/video.py) drawn from the prompt, rendered on the first download and kept with the
job. The official client sends the create request as multipart/form-data even without a file; JSON is
accepted as well, and an `input_reference` upload is recorded but otherwise ignored.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

import orjson
from aiohttp import web

from ..core import parse_multipart
from . import directives
from .directives import DirectiveError
from .video import MAX_SECONDS, render_mp4
from .wire import Answer, Headers, openai_error_body, respond

if TYPE_CHECKING:
    from .state import Simulator

DEFAULT_MODEL = "sora-2"
DEFAULT_SECONDS = 4
DEFAULT_SIZE = "720x1280"
QUEUED_SHARE = 0.2  # the share of the render time a job spends queued
EXPIRES_AFTER = 3600  # seconds from completion until the content expires, as reported
CONTENT_SIDE = 128  # the long side of the rendered file at most; the reported size is as asked
MAX_JOBS = 1000  # the oldest jobs are forgotten beyond this, as the request log forgets
_SIZE = re.compile(r"^([1-9]\d{0,4})x([1-9]\d{0,4})$")
_MB = 16  # the renderer's sides are whole macroblocks


@dataclass(slots=True)
class Job:
    id: str
    created: float  # time.time() at creation, reported in whole seconds
    started: float  # time.monotonic() at creation: the status is computed from it
    model: str
    prompt: str
    seconds: int
    size: str
    render: float
    render_fail: bool
    content: bytes | None = None  # rendered on the first download


class VideoJobs:
    def __init__(self, history: int = MAX_JOBS) -> None:
        self.jobs: dict[str, Job] = {}  # in creation order, oldest first
        self.history = history

    async def create(
        self, headers: Headers, body: bytes, record: dict[str, Any]
    ) -> tuple[Answer, dict[str, Any] | None]:
        content_type = headers.get("content-type", "")
        fields: dict[str, Any]
        if content_type.startswith("multipart/form-data"):
            parts = parse_multipart(body, content_type)
            if parts is None:
                return _error(400, "Could not parse multipart form"), None
            fields = {p.name: p.data.decode(errors="replace") for p in parts if p.filename is None}
            record["files"] = [
                {"name": p.name, "filename": p.filename, "content_type": p.content_type, "size": len(p.data)}
                for p in parts
                if p.filename is not None
            ]
        else:
            try:
                req = orjson.loads(body)
            except orjson.JSONDecodeError:
                req = None
            if not isinstance(req, dict):
                return _error(400, "We could not parse the JSON body of your request."), None
            fields = req
        record["body"] = fields

        prompt, model = fields.get("prompt"), fields.get("model", DEFAULT_MODEL)
        if not isinstance(prompt, str) or not prompt:
            message = "Missing required parameter: 'prompt'."
            return _error(400, message, "prompt", "missing_required_parameter"), record
        if not isinstance(model, str) or not model:
            return _error(400, "model must be a string.", "model"), record
        try:
            base, d = directives.parse(model, headers.get("x-sim"), prompt)
        except DirectiveError as exc:
            return _error(400, str(exc)), record
        if d.ttft:
            await asyncio.sleep(d.ttft)
        if d.fail is not None:
            kind = "rate_limit_error" if d.fail == 429 else "server_error"
            return _error(d.fail, f"Simulated failure {d.fail}.", type_=kind), record
        seconds = _whole(fields.get("seconds", DEFAULT_SECONDS), MAX_SECONDS)
        if seconds is None:
            message = f"Invalid 'seconds': use a whole number of seconds from 1 to {MAX_SECONDS}."
            return _error(400, message, "seconds", "invalid_value"), record
        size = fields.get("size", DEFAULT_SIZE)
        if not isinstance(size, str) or _SIZE.match(size) is None:
            message = f"Invalid 'size' {size!r}: use WIDTHxHEIGHT, such as {DEFAULT_SIZE}."
            return _error(400, message, "size", "invalid_value"), record

        job = Job(
            id="video_" + os.urandom(16).hex(),
            created=time.time(),
            started=time.monotonic(),
            model=base,
            prompt=prompt,
            seconds=seconds,
            size=size,
            render=d.render,
            render_fail=d.render_fail,
        )
        self.jobs[job.id] = job
        while len(self.jobs) > self.history:
            del self.jobs[next(iter(self.jobs))]
        return Answer(200, orjson.dumps(_video(job))), record

    def page(self, query: dict[str, list[str]]) -> Answer:
        """Jobs newest first (or oldest first with order=asc), a page of `limit` after the id `after`."""
        limit = _whole(query.get("limit", ["20"])[-1], 100)
        order = query.get("order", ["desc"])[-1]
        if limit is None or order not in ("asc", "desc"):
            return _error(400, "limit must be from 1 to 100 and order asc or desc.", "limit")
        jobs = list(self.jobs.values())
        if order == "desc":
            jobs.reverse()
        after = query.get("after", [None])[-1]
        if after is not None:
            ids = [j.id for j in jobs]
            # An id this simulator does not hold (any more) leaves nothing after it.
            jobs = jobs[ids.index(after) + 1 :] if after in ids else []
        page = [_video(j) for j in jobs[:limit]]
        return Answer(
            200,
            orjson.dumps(
                {
                    "object": "list",
                    "data": page,
                    "first_id": page[0]["id"] if page else None,
                    "last_id": page[-1]["id"] if page else None,
                    "has_more": len(jobs) > limit,
                }
            ),
        )

    def content(self, video_id: str, query: dict[str, list[str]]) -> Answer:
        job = self.jobs.get(video_id)
        if job is None:
            return _not_found(video_id)
        variant = query.get("variant", ["video"])[-1]
        if variant != "video":
            message = f"The simulator renders the video variant only, not {variant!r}."
            return _error(400, message, "variant", "invalid_value")
        status = _state(job)[0]
        if status == "failed":
            return _error(404, f"Video {video_id} failed to generate: it has no content.")
        if status != "completed":
            return _error(404, f"Video {video_id} is not ready yet: it is {status}.")
        if job.content is None:
            width, height = _content_size(job.size)
            job.content = render_mp4(job.prompt, job.seconds, width, height)
        return Answer(200, job.content, "video/mp4")

    def delete(self, video_id: str) -> Answer:
        if self.jobs.pop(video_id, None) is None:
            return _not_found(video_id)
        return Answer(200, orjson.dumps({"id": video_id, "object": "video.deleted", "deleted": True}))


def _state(job: Job) -> tuple[str, int]:
    """The job's status and progress now: queued, then in_progress (0..99), then completed or failed."""
    elapsed = time.monotonic() - job.started
    if elapsed >= job.render:
        return ("failed" if job.render_fail else "completed"), 100
    queued = job.render * QUEUED_SHARE
    if elapsed < queued:
        return "queued", 0
    return "in_progress", min(99, int(100 * (elapsed - queued) / (job.render - queued)))


def _video(job: Job) -> dict[str, Any]:
    """The job as OpenAI's Video object. A finished job reports when it finished, the end of its render
    time, whether it completed or failed; only completed content expires, an hour later."""
    status, progress = _state(job)
    completed_at = int(job.created + job.render) if status in ("completed", "failed") else None
    expires_at = completed_at + EXPIRES_AFTER if completed_at is not None and status == "completed" else None
    error = None
    if status == "failed":
        error = {"code": "video_generation_failed", "message": "Simulated failure: the video did not render."}
    return {
        "id": job.id,
        "object": "video",
        "created_at": int(job.created),
        "status": status,
        "model": job.model,
        "progress": progress,
        "seconds": str(job.seconds),
        "size": job.size,
        "prompt": job.prompt,
        "completed_at": completed_at,
        "expires_at": expires_at,
        "error": error,
        "remixed_from_video_id": None,
    }


def _whole(value: Any, top: int) -> int | None:
    """A whole number from 1 to top, given as a JSON integer or a string of digits (as a form sends)."""
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= top:
        return value
    return None


def _content_size(size: str) -> tuple[int, int]:
    """A small picture of the requested size's shape: the long side at most CONTENT_SIDE, each side a
    multiple of 16 and at least 16, as the renderer needs."""
    match = _SIZE.match(size)
    assert match is not None, "sizes are checked on creation"
    width, height = int(match[1]), int(match[2])
    scale = min(1.0, CONTENT_SIDE / max(width, height))
    return max(_MB, round(width * scale / _MB) * _MB), max(_MB, round(height * scale / _MB) * _MB)


def _error(
    status: int,
    message: str,
    param: str | None = None,
    code: str | None = None,
    *,
    type_: str = "invalid_request_error",
) -> Answer:
    return Answer(status, openai_error_body(message, type_, param, code))


def _not_found(video_id: str) -> Answer:
    return _error(404, f"Video with id '{video_id}' not found.", code="not_found")


# The routes: POST and GET .../videos, GET and DELETE .../videos/{id}, GET .../videos/{id}/content.


async def create(sim: Simulator, request: web.Request) -> web.StreamResponse:
    answer, record = await sim.videos.create(request.headers, await request.read(), _record(request))
    sim.record(record)
    return respond(answer)


async def list_jobs(sim: Simulator, request: web.Request) -> web.StreamResponse:
    sim.record(_record(request))
    return respond(sim.videos.page(parse_qs(request.query_string)))


async def retrieve(sim: Simulator, request: web.Request) -> web.StreamResponse:
    video_id = request.match_info["id"]
    sim.record(_record(request, video_id))
    job = sim.videos.jobs.get(video_id)
    return respond(Answer(200, orjson.dumps(_video(job))) if job else _not_found(video_id))


async def delete(sim: Simulator, request: web.Request) -> web.StreamResponse:
    video_id = request.match_info["id"]
    sim.record(_record(request, video_id))
    return respond(sim.videos.delete(video_id))


async def content(sim: Simulator, request: web.Request) -> web.StreamResponse:
    video_id = request.match_info["id"]
    sim.record(_record(request, video_id, "/content"))
    return respond(sim.videos.content(video_id, parse_qs(request.query_string)))


def _record(request: web.Request, video_id: str | None = None, tail: str = "") -> dict[str, Any]:
    """What /_sim/requests keeps of a request; a create's fields replace its empty body."""
    return {
        "path": "/v1/videos" + (f"/{video_id}" if video_id else "") + tail,
        "method": request.method,
        "authorization": request.headers.get("authorization"),
        "body": {},
    }

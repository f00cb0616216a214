"""/v1/videos (Shape A, OpenAI's Videos API): create a job, follow it, list them, download the file
(spec 2.2, 3.1). The jobs themselves are driven by gateway.videos.

Creation takes JSON, as the spec shows, or multipart/form-data, which the official openai client
sends (with an optional `input_reference` image passed on to the model). A job belongs to the key
that created it: another key's job is 404.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any, Final

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .. import admin_fields as field
from .. import billing, jobs, management, safety, videos
from ..auth import authenticate
from ..clock import now_ms
from ..context import Call
from ..core import MultipartPart
from ..errors import GatewayError, invalid_request
from ..ids import response_id
from ..pricing import prices_text
from ..registry import REQUIRED_FIELDS
from ..routing import ChannelBody
from ..state import GatewayState
from ..store import Job
from .common import (
    REQUEST_ID_HEADER,
    json_response,
    model_endpoint,
    owned_job,
    parse_object,
    public_base,
    read_body,
    resolve_model,
)
from .multipart import FormPart, channel_form, form_parts, is_form
from .upstream import call_upstream

MAX_SECONDS: Final = 60  # the longest clip a request may ask for
_SIZE: Final = re.compile(r"^[1-9][0-9]{1,4}x[1-9][0-9]{1,4}$")
# The openai client's poll() waits this long between looks when the answer says so.
POLL_AFTER_HEADER: Final = "openai-poll-after-ms"


def routes(state: GatewayState) -> list[Route]:
    async def create(request: Request, call: Call) -> Response:
        raw = await read_body(request, state.settings.max_request_bytes)
        fields, parts = _fields(request, raw)
        model = resolve_model(state, call, fields.get("model"), "video")
        prompt = fields.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise invalid_request("`prompt` is required: a description of the video.", "prompt")
        seconds = _seconds(fields.get("seconds"))
        size = fields.get("size")
        if size is not None and (not isinstance(size, str) or not _SIZE.match(size)):
            raise invalid_request("`size` must be width x height, e.g. 1280x720.", "size")
        await safety.check(state, request, call, model, fields)
        await billing.hold(state, call, model, videos.estimate(seconds))
        # JSON in, JSON out; a form in, a form out (its files passed on as they came).
        body: ChannelBody
        content_type: str | None = None
        if parts is None:
            body = state.registry.channel_body(model, {**fields, "seconds": seconds}, call)
        else:
            kept = state.registry.form_parts(model, parts, REQUIRED_FIELDS["video"], call)
            body, content_type = channel_form(
                FormPart(p.name, p.data, p.filename, p.content_type) for p in kept
            )
        # Never sent twice: a second POST could start a second job the gateway never hears of.
        # Nor cancelled when the client leaves: a job the upstream started must be recorded.
        call.cancel_on_disconnect = False
        answered = await call_upstream(state, request, call, model, body, content_type, replayable=False)
        upstream_id, rendered_size = _accepted(answered.content)
        job = Job(
            id=response_id("video_"),
            kind="video",
            key_id=call.ctx.key.id,
            account_id=call.ctx.account.id,
            request_id=call.request_id,
            model=model.name,
            channel=answered.channel.identity,
            upstream_id=upstream_id,
            status="queued",
            progress=0,
            hold=call.hold.amount if call.hold is not None else Decimal(0),
            created_at_ms=now_ms(),
            prices=prices_text(model.prices),  # what the hold was made at
            prompt=prompt,
            seconds=seconds,
            size=size or rendered_size,  # a request without one shows the upstream's default
        )
        # The hold now belongs to the job: settled or released when the job ends, by whichever
        # process sees that happen.
        answer = json_response(videos.job_object(job, None), headers={REQUEST_ID_HEADER: call.request_id})
        await jobs.record(state, call, job, answer)
        return answer

    async def retrieve(request: Request) -> Response:
        job = await owned_job(state, request, "video", "video_id", "video")
        headers = {POLL_AFTER_HEADER: str(int(state.settings.videos.poll_seconds * 1000))}
        return json_response(videos.job_object(job, _content_url(state, request, job)), headers=headers)

    async def list_jobs(request: Request) -> Response:
        ctx = await authenticate(request, state.store)
        query = request.query_params
        limit = field.page_size(query.get("limit"), "limit", default=20, maximum=100)  # as OpenAI
        order = query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise invalid_request("`order` must be asc or desc.", "order")
        found = await state.store.list_jobs(
            ctx.key.id, "video", after=query.get("after"), limit=limit + 1, newest_first=order == "desc"
        )

        async def video_exists(job_id: str) -> bool:
            return await state.store.get_job(job_id, ctx.key.id, "video") is not None

        await management.known_cursor(query.get("after"), found, "after", "video of this key", video_exists)
        page = [videos.job_object(job, _content_url(state, request, job)) for job in found[:limit]]
        return json_response(
            {
                "object": "list",
                "data": page,
                "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None,
                "has_more": len(found) > limit,
            }
        )

    async def content(request: Request) -> Response:
        job = await owned_job(state, request, "video", "video_id", "video")
        variant = request.query_params.get("variant", "video")
        if variant != "video":
            raise invalid_request("Only the `video` variant is kept by this gateway.", "variant")
        if job.status != "completed":
            raise GatewayError(
                "not_found", f"The video {job.id!r} is {job.status}: its file exists once it is completed."
            )
        found = await state.store.get_video_content(job.id, job.key_id, now_ms())
        if found is None:
            raise GatewayError("not_found", f"The file of video {job.id!r} has expired.")
        data, media_type = found
        return Response(data, media_type=media_type)

    return [
        Route("/v1/videos", model_endpoint(state, create, idempotent=True), methods=["POST"]),
        Route("/v1/videos", list_jobs, methods=["GET"]),
        Route("/v1/videos/{video_id}", retrieve, methods=["GET"]),
        Route("/v1/videos/{video_id}/content", content, methods=["GET"]),
    ]


def _fields(request: Request, raw: bytes) -> tuple[dict[str, Any], list[MultipartPart] | None]:
    """The request's fields, and its parts when it is a form."""
    content_type = request.headers.get("content-type", "")
    if not is_form(content_type):
        return parse_object(raw), None
    parts = form_parts(raw, content_type)
    if parts is None:
        raise invalid_request("The request must be a well-formed multipart/form-data body.")
    return {p.name: p.data.decode(errors="replace") for p in parts if p.filename is None}, parts


def _seconds(value: Any) -> str:
    if value is None:
        return videos.DEFAULT_SECONDS
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    if (
        not isinstance(text, str)
        or not (text.isascii() and text.isdigit())
        or not 1 <= int(text) <= MAX_SECONDS
    ):
        raise invalid_request(
            f"`seconds` must be a whole number of seconds from 1 to {MAX_SECONDS}.", "seconds"
        )
    return str(int(text))


def _accepted(content: bytes) -> tuple[str, str | None]:
    """The upstream's id for the job it accepted, and the size it says it renders (None: it says
    none, or not as width x height)."""
    try:
        answer = orjson.loads(content)
    except orjson.JSONDecodeError as exc:
        raise GatewayError("provider_error", "The model's provider sent a malformed answer.") from exc
    upstream_id = answer.get("id") if isinstance(answer, dict) else None
    if not isinstance(upstream_id, str) or not upstream_id or "/" in upstream_id:
        raise GatewayError("provider_error", "The model's provider sent no job id.")
    size = answer.get("size")
    return upstream_id, size if isinstance(size, str) and _SIZE.match(size) else None


def _content_url(state: GatewayState, request: Request, job: Job) -> str | None:
    if job.status != "completed":
        return None
    return f"{public_base(state, request)}/v1/videos/{job.id}/content"

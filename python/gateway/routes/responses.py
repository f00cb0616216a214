"""POST /v1/responses (Shape A, OpenAI's Responses API): plain and streamed, stateful.

The client only ever sees the gateway's response ids. Where each response's state lives upstream
(channel and the upstream's own id) is stored, so a later turn naming it as previous_response_id is
sent to the channel that holds the conversation, naming the id that channel knows. Hosted tools
(web search, file search, code interpreter ...) are parameters like any other: passed through when
the model supports `tools`, and their results come back in the output untouched.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .. import background, billing, jobs
from ..auth import authenticate
from ..clock import now_ms
from ..config import ChannelConfig, ModelConfig
from ..context import Call
from ..core import (
    InvalidJsonError,
    ResponsesStreamRewriter,
    count_prompt_tokens,
    count_tokens,
    rewrite_response,
)
from ..errors import GatewayError, invalid_request, quoted_id
from ..ids import response_id
from ..pricing import Usage, format_cost, reported_usage
from ..routing import json_body
from ..state import GatewayState
from ..store import JOB_RUNNING, Job, ResponseState
from ..stream_errors import responses_error_event
from ..translate import (
    ResponsesStreamFromChat,
    chat_request_from_responses,
    response_from_chat_completion,
    response_output_text,
)
from ..translate.responses_request import FROM_RESPONSES
from ..translate.stream_base import FromChatStream
from . import kept_responses
from .common import REQUEST_ID_HEADER, model_endpoint, owned_job, parse_object, read_body, resolve_model
from .streaming import forward_stream
from .text import check_and_hold
from .translated import chat_body, forward_to_chat_model
from .upstream import call_upstream

log = logging.getLogger("gateway.responses")


def routes(state: GatewayState) -> list[Route]:
    async def responses(request: Request, call: Call) -> Response:
        payload = parse_object(await read_body(request, state.settings.max_request_bytes))
        model = resolve_model(state, call, payload.get("model"), "responses")
        _validate(payload)
        if model.type in ("chat", "messages"):
            return await _from_chat_model(state, request, call, model, payload)
        received = state.registry.received_fields(model)
        billing.cap_output(received, model, payload, "max_output_tokens")
        upstream = state.registry.upstream_body(model, payload, call)
        billing.send_output_limit(received, model, upstream, "max_output_tokens")  # the hold reads payload
        # Run upstream in the background only by a model that takes the parameter (spec 1.3).
        in_background = upstream.get("background") is True
        if in_background:
            _validate_background(payload)
        await kept_responses.refuse_kept_items(state, call, model, payload)
        previous = payload.get("previous_response_id")
        only: ChannelConfig | None = None
        earlier = 0
        said_as_gateway_ids = _GatewayIds()
        if previous is not None:
            held = await state.store.find_response(previous, call.ctx.account.id, now_ms())
            if held is None:
                raise await kept_responses.previous_unknown(state, call, model, previous)
            only = _channel_holding(model, held)
            upstream["previous_response_id"] = held.upstream_id
            said_as_gateway_ids = _GatewayIds(held.upstream_id, previous)
            earlier = await _earlier_tokens(state, call, held)
        prompt = await _check_and_hold(state, request, call, model, payload, earlier=earlier)
        rid = response_id("resp_")
        stored_upstream = upstream.get("store") is not False

        async def remember(
            upstream_id: str | None,
            channel: ChannelConfig,
            usage: Usage | None = None,
            items: list[str] | None = None,
        ) -> None:
            """Record where the response lives upstream, and the conversation a turn continuing it
            has the upstream read: its prompt (earlier turns in it) and its output, or as much
            output as it may make while that is not known yet; and its output `items`, once known,
            as this account's (kept_responses.refuse_kept_items)."""
            if stored_upstream and upstream_id:
                context = (
                    usage.prompt_tokens + usage.completion_tokens
                    if usage is not None
                    else prompt
                    + billing.estimate_usage(model, 0, payload, "max_output_tokens").completion_tokens
                )
                await state.store.remember_response(
                    ResponseState(
                        id=rid,
                        account_id=call.ctx.account.id,
                        model=model.name,
                        channel_url=channel.base_url,
                        upstream_id=upstream_id,
                        expires_at_ms=now_ms() + kept_responses.RESPONSE_TTL_MS,
                        context_tokens=context,
                        item_ids=tuple(items or ()),
                    )
                )

        async def items_made(rewriter: ResponsesStreamRewriter) -> bytes:
            """A stream's output items, recorded before its end goes out (the next turn may name
            them at once). A store that cannot take them leaves the answer whole (code review: the
            stream ended in an error instead): only a later item_reference to them is refused."""
            if rewriter.upstream_id:
                try:
                    await kept_responses.remember_items(state, call.ctx.account.id, rewriter.item_ids)
                except Exception:
                    log.warning(
                        "request %s: its output items could not be recorded", call.request_id, exc_info=True
                    )
            return b""

        if payload.get("stream") is True:
            streaming = forward_stream(
                state,
                request,
                call,
                model,
                json_body(upstream),
                rid,
                lambda: ResponsesStreamRewriter(rid, previous),
                prompt,
                error_event=responses_error_event,
                only=only,
                on_start=lambda rewriter, channel: remember(rewriter.upstream_id, channel),
                on_end=items_made if stored_upstream else None,
            )
            with said_as_gateway_ids:
                return await streaming

        # A background response is a job upstream: never cancelled by the client leaving, so that
        # the job the upstream started is recorded (and its hold kept) whatever happens.
        call.cancel_on_disconnect = not in_background
        with said_as_gateway_ids:
            answered = await call_upstream(
                state, request, call, model, json_body(upstream), only=only, replayable=not in_background
            )
        try:
            answer = rewrite_response(answered.content, rid, previous)
            parsed = orjson.loads(answer.body)
            status = parsed.get("status")
        except (InvalidJsonError, orjson.JSONDecodeError) as exc:
            raise GatewayError("provider_error", "The model's provider sent a malformed answer.") from exc
        if in_background and status in JOB_RUNNING:
            if not answer.upstream_id:
                raise GatewayError("provider_error", "The model's provider sent no response id.")
            await remember(answer.upstream_id, answered.channel)
            # Held until it ends, then settled by the job poller (gateway.background).
            await background.start(
                state,
                call,
                model,
                answered.channel,
                rid,
                previous,
                answer,
                status,
                prompt,
            )
            return Response(
                answer.body, media_type="application/json", headers={REQUEST_ID_HEADER: call.request_id}
            )
        usage = (
            reported_usage(answer.usage)
            if answer.usage is not None
            else Usage(prompt, count_tokens(response_output_text(answer.body), model.tokenizer))
        )
        # Charged first: the model has run, so its cost is kept even if keeping the state fails.
        charged = billing.settle(state, call, model, rid, "completed", usage)
        await remember(answer.upstream_id, answered.channel, usage, kept_responses.output_item_ids(parsed))
        return Response(
            answer.body,
            media_type="application/json",
            headers={REQUEST_ID_HEADER: call.request_id, "x-service-cost": format_cost(charged)},
        )

    async def retrieve(request: Request) -> Response:
        """A response the gateway keeps (a chat model's, routes/kept_responses.py), a background
        one, or one an upstream keeps, fetched from it under the gateway's id."""
        ctx = await authenticate(request, state.store)
        if request.query_params.get("stream") in ("true", "1"):
            raise invalid_request(
                "A stored response is not streamed again by this gateway: poll it.", "stream"
            )
        rid = request.path_params["response_id"]
        kept = await state.store.find_kept_response(rid, ctx.account.id, now_ms())
        if kept is not None:
            return Response(kept.body, media_type="application/json")
        job = await state.store.get_job(rid, ctx.key.id, "response")
        if job is not None:
            return _job_response(job)
        if await state.store.job_key(rid, ctx.account.id, "response") is not None:
            raise not_found_response(rid)  # another key's background response (review: it was shown)
        held = await state.store.find_response(rid, ctx.account.id, now_ms())
        if held is None:  # in OpenAI's words, as DELETE says it
            raise not_found_response(rid)
        return await _kept_upstream(state, held, request.url.query)

    async def delete(request: Request) -> Response:
        """DELETE /v1/responses/{id} (the openai client's responses.delete), as OpenAI answers it. A
        response the gateway keeps is deleted here (a later turn that continued it can no longer
        be continued: kept_responses); one an upstream keeps is deleted there, then forgotten. A
        background response's record is its charge's, and stays (docs/behaviour.md)."""
        ctx = await authenticate(request, state.store)
        response_id = request.path_params["response_id"]
        account = ctx.account.id
        if not await state.store.delete_kept_response(response_id, account):
            owner = await state.store.job_key(response_id, account, "response")
            if owner is not None and owner != ctx.key.id:  # another key's: not this key's to see
                raise not_found_response(response_id)
            if owner is not None:
                raise invalid_request(
                    f"Response {quoted_id(response_id)} ran in the background: its record is kept with"
                    " its charge, and this gateway does not delete it.",
                )
            held = await state.store.find_response(response_id, account, now_ms())
            if held is None:
                raise not_found_response(response_id)
            with _GatewayIds(held.upstream_id, held.id):
                await jobs.delete(state, _holder(state, held), f"/responses/{held.upstream_id}")
            await state.store.forget_response(response_id, account)
        body = {"id": response_id, "object": "response", "deleted": True}
        return Response(orjson.dumps(body), media_type="application/json")

    async def cancel(request: Request) -> Response:
        try:
            job = await owned_job(state, request, "response", "response_id", "background response")
        except GatewayError as err:
            if err.code != "not_found":
                raise
            # A response that ran in the foreground exists all the same: 400, as OpenAI answers it.
            rid = request.path_params["response_id"]
            account = (await authenticate(request, state.store)).account.id
            if await state.store.job_key(rid, account, "response") is not None:
                raise  # another key's background response (review: a 400 said it was none)
            if (
                await state.store.find_kept_response(rid, account, now_ms()) is not None
                or await state.store.find_response(rid, account, now_ms()) is not None
            ):
                raise invalid_request(
                    f"Response {quoted_id(rid)} was not created with background: true: only a background"
                    " response can be cancelled."
                ) from None
            raise
        if job.status in JOB_RUNNING:
            await background.cancel(state, job)
            ended = await state.store.get_job(job.id, job.key_id, "response")
            assert ended is not None, "jobs are never deleted"
            job = ended
        return _job_response(job)

    return [
        Route("/v1/responses", model_endpoint(state, responses), methods=["POST"]),
        Route("/v1/responses/{response_id}", retrieve, methods=["GET"]),
        Route("/v1/responses/{response_id}", delete, methods=["DELETE"]),
        Route("/v1/responses/{response_id}/cancel", cancel, methods=["POST"]),
    ]


async def _check_and_hold(
    state: GatewayState,
    request: Request,
    call: Call,
    model: ModelConfig,
    payload: dict[str, Any],
    brought: int = 0,
    earlier: int = 0,
) -> int:
    """check_and_hold of a turn; `earlier` is the tokens of the conversation an upstream holds for
    it (_earlier_tokens), which it reads again with this turn's input."""

    def prompt_tokens() -> tuple[int, int]:
        tokens, audio = _prompt_tokens(model, payload)
        return tokens + earlier, audio

    return await check_and_hold(
        state,
        request,
        call,
        model,
        payload,
        "responses",
        prompt_tokens,
        "max_output_tokens",
        brought=brought,
    )


async def _earlier_tokens(state: GatewayState, call: Call, previous: ResponseState) -> int:
    """What a turn continuing `previous`, whose conversation an upstream holds, makes it read again
    besides its own input: that response's prompt (its own earlier turns in it) and its output, as
    they were charged, or, before that charge is recorded (moments after its answer, a stream's
    or a background response's until it ends), the most its state says they can be. Held with the
    turn, so that turns continuing a long conversation, at once or one right after another, cannot
    each be admitted on their small input and charged the whole conversation (reviews: twelve at
    once took a balance $0.32 below zero; a client sending each turn as the last one's answer came
    took it below zero too)."""
    found = await state.store.account_usages(call.ctx.account.id, [previous.id])
    if found:
        return sum(r.prompt_tokens + r.completion_tokens for r in found)
    return previous.context_tokens


async def _from_chat_model(
    state: GatewayState, request: Request, call: Call, model: ModelConfig, payload: dict[str, Any]
) -> Response:
    """A chat model in the responses shape: the request goes out as a chat completions request, the
    answer or stream comes back as a Response (gateway.translate), billed from the upstream's own
    usage. A messages model the same way, its request and answer translated once more, between
    the chat shape and its own (routes/translated.py). Neither upstream holds a conversation, so
    the gateway keeps it (routes/kept_responses.py): the earlier turns a request names go upstream
    with it, and its answer is kept for the next. It runs nothing in the background: `background`
    is dropped (spec 1.3, as a responses model that does not take it drops it) and the response
    answered at once, `status` already final."""
    turn = await kept_responses.resolve(state, call, payload)
    upstream = chat_body(
        state,
        model,
        turn.payload,
        call,
        chat_request_from_responses,
        "max_output_tokens",
        "input",
        FROM_RESPONSES,
    )
    prompt = await _check_and_hold(state, request, call, model, turn.payload, turn.brought)
    rid = response_id("resp_")
    keeps = payload.get("store") is not False

    async def kept_stream_end(stream: FromChatStream) -> bytes:
        assert isinstance(stream, ResponsesStreamFromChat) and stream.answer is not None
        return stream.last_events(await kept_responses.keep(state, call, model, turn, stream.answer))

    async def kept_answer(body: bytes) -> bytes:
        answer = orjson.loads(body)
        if await kept_responses.keep(state, call, model, turn, answer):
            return body
        return orjson.dumps({**answer, "store": False})

    return await forward_to_chat_model(
        state,
        request,
        call,
        model,
        payload,
        upstream,
        rid,
        prompt,
        new_stream=lambda counted: ResponsesStreamFromChat(rid, payload, counted, hold_end=keeps),
        from_chat=lambda completion, usage: response_from_chat_completion(completion, usage, rid, payload),
        error_event=responses_error_event,
        on_end=kept_stream_end if keeps else None,
        on_answer=kept_answer if keeps else None,
    )


def _job_response(job: Job) -> Response:
    assert job.body is not None, "a response job keeps its Response object from the start"
    return Response(job.body, media_type="application/json")


def _validate_background(payload: dict[str, Any]) -> None:
    """What a background response may not be (as OpenAI refuses it)."""
    if payload.get("stream") is True:
        raise invalid_request(
            "A background response is not streamed by this gateway: poll GET /v1/responses/{id}.", "stream"
        )
    if payload.get("store") is False:
        raise invalid_request("A background response must be stored: `store` cannot be false.", "store")


def _validate(payload: dict[str, Any]) -> None:
    value = payload.get("input")
    if value is None and not any(payload.get(k) is not None for k in ("previous_response_id", "prompt")):
        raise invalid_request("`input` is required.", "input")
    if value is not None and not isinstance(value, str | list):
        raise invalid_request("`input` must be a string or an array of input items.", "input")
    if isinstance(value, list) and not all(isinstance(item, dict) for item in value):
        raise invalid_request("Every entry of `input` must be an object.", "input")
    previous = payload.get("previous_response_id")
    if previous is not None and (not isinstance(previous, str) or not previous):
        raise invalid_request("`previous_response_id` must be a response id.", "previous_response_id")
    for flag in ("stream", "background", "store"):
        if flag in payload and not isinstance(payload[flag], bool | None):
            raise invalid_request(f"`{flag}` must be a boolean.", flag)


def not_found_response(response_id: str) -> GatewayError:
    return GatewayError("not_found", f"Response with id {quoted_id(response_id)} not found.")


async def _kept_upstream(state: GatewayState, held: ResponseState, query: str) -> Response:
    """A response an upstream keeps, as it answers GET for it (the request's query, `include`,
    passed on), under the gateway's id, and the response it continued under its gateway id too
    when the gateway still knows it; its 404 (deleted or expired there) in OpenAI's words."""
    path = f"/responses/{held.upstream_id}" + (f"?{query}" if query else "")
    try:
        with _GatewayIds(held.upstream_id, held.id):
            content, _ = await jobs.get(state, _holder(state, held), path, jobs.MAX_STATE_BYTES)
    except GatewayError as failure:
        if failure.code == "not_found":
            raise not_found_response(held.id) from None
        raise
    malformed = GatewayError("provider_error", "The model's provider sent a malformed answer.")
    try:
        answer = orjson.loads(content)
    except orjson.JSONDecodeError:
        raise malformed from None
    upstream_previous = answer.get("previous_response_id") if isinstance(answer, dict) else None
    previous = None
    if isinstance(upstream_previous, str):
        previous = await state.store.gateway_response_id(
            upstream_previous, held.channel_url, held.account_id, now_ms()
        )
    try:
        body = rewrite_response(content, held.id, previous).body
    except InvalidJsonError:
        raise malformed from None
    if previous is None and isinstance(upstream_previous, str):
        # The response it continued was deleted (or has expired) here: its gateway id is gone, and
        # the upstream's own id is never shown (review: it was).
        shown = orjson.loads(body)
        shown["previous_response_id"] = None
        body = orjson.dumps(shown)
    return Response(body, media_type="application/json")


def _channel_at(model: ModelConfig, held: ResponseState) -> ChannelConfig | None:
    """The model's channel at the upstream that holds a response's state, if it still has one."""
    return next((c for c in model.channels if c.base_url == held.channel_url), None)


def _holder(state: GatewayState, held: ResponseState) -> ChannelConfig:
    """The channel whose upstream holds a response's state, of the model that made it."""
    model = state.registry.get(held.model)
    channel = _channel_at(model, held) if model is not None else None
    if channel is not None:
        return channel
    raise invalid_request(
        f"Response {quoted_id(held.id)} is kept by an upstream of {held.model!r} that the configuration"
        " no longer names: the gateway cannot reach it."
    )


class _GatewayIds:
    """An upstream's refusal that quotes the response it was asked to continue by the id it keeps
    it under (OpenAI's "Previous response with id 'resp_…' not found.") names the gateway's id
    instead: a client never sees an upstream's ids (responses review). Nothing when the request
    continues no response."""

    __slots__ = ("gateway_id", "upstream_id")

    def __init__(self, upstream_id: str = "", gateway_id: str = "") -> None:
        self.upstream_id = upstream_id
        self.gateway_id = gateway_id

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, error: BaseException | None, trace: object) -> None:
        if isinstance(error, GatewayError) and self.upstream_id and self.upstream_id in error.message:
            error.message = error.message.replace(self.upstream_id, self.gateway_id)
            error.args = (error.message,)


def _channel_holding(model: ModelConfig, held: ResponseState) -> ChannelConfig:
    """The model's channel on the upstream that holds the previous response's state."""
    channel = _channel_at(model, held)
    if channel is not None:
        return channel
    raise invalid_request(
        f"Response {held.id!r} was made by {held.model!r}, whose upstream holds its state; "
        f"{model.name!r} cannot reach it. Continue the conversation with {held.model!r}.",
        "previous_response_id",
    )


def _prompt_tokens(model: ModelConfig, payload: dict[str, Any]) -> tuple[int, int]:
    """The gateway's own count of this turn's input, for the hold and for the bill when the upstream
    reports no usage (earlier turns held upstream are added from their charges: _earlier_tokens)."""
    messages: list[dict[str, Any]] = []
    if isinstance(payload.get("instructions"), str):
        messages.append({"role": "system", "content": payload["instructions"]})
    value = payload.get("input")
    if isinstance(value, str):
        messages.append({"role": "user", "content": value})
    for item in value if isinstance(value, list) else []:
        role = item.get("role") if isinstance(item.get("role"), str) else "user"
        content = item.get("content")
        # A message's content as it is (its images count too); any other item (a tool call, its
        # output, a reasoning item) as a part of its own, counted whole: nothing it carries is free.
        said = content if isinstance(content, str | list) and "role" in item else [item]
        messages.append({"role": role, "content": said})
    # The tools and the output's format (`text`) are prompt too, as the provider bills them.
    counted = {"messages": messages, "tools": payload.get("tools"), "response_format": payload.get("text")}
    return count_prompt_tokens(orjson.dumps(counted), model.tokenizer, model.image_tokens)

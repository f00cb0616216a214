"""POST /v1/responses (Shape A, OpenAI's Responses API): plain and streamed, stateful.

The client only ever sees the gateway's response ids. Where each response's state lives upstream
(channel and the upstream's own id) is stored, so a later turn naming it as previous_response_id is
sent to the channel that holds the conversation, naming the id that channel knows. Hosted tools
(web search, file search, code interpreter ...) are parameters like any other: passed through when
the model supports `tools`, and their results come back in the output untouched.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .. import billing
from .._core import (
    InvalidJsonError,
    ResponsesStreamRewriter,
    count_chat_tokens,
    count_tokens,
    rewrite_response,
)
from ..billing import Call
from ..clock import now_ms
from ..config import ChannelConfig, ModelConfig
from ..errors import GatewayError, invalid_request
from ..ids import response_id
from ..pricing import Usage, format_cost
from ..routing import json_body
from ..state import GatewayState
from ..store import ResponseState
from .common import REQUEST_ID_HEADER, model_endpoint, parse_object, read_body
from .streaming import forward_stream
from .upstream import call_upstream, reported_usage

# How long a response can be continued, as OpenAI keeps stored responses (30 days).
STATE_TTL_MS = 30 * 24 * 3600 * 1000


def routes(state: GatewayState) -> list[Route]:
    async def responses(request: Request, call: Call) -> Response:
        payload = parse_object(await read_body(request, state.settings.max_request_bytes))
        model = state.registry.resolve(payload.get("model"), call.ctx, "responses")
        _validate(payload)
        # Earlier turns held upstream (previous_response_id) cannot be counted here.
        await billing.hold(
            state,
            call,
            model,
            billing.estimate_usage(model, _prompt_tokens(model, payload), payload, "max_output_tokens"),
        )

        upstream = state.registry.upstream_body(model, payload)
        previous = payload.get("previous_response_id")
        only: ChannelConfig | None = None
        if previous is not None:
            held = await state.store.find_response(previous, call.ctx.account.id, now_ms())
            if held is None:
                raise invalid_request(
                    f"Previous response with id {previous!r} not found.", "previous_response_id"
                )
            only = _channel_holding(model, held)
            upstream["previous_response_id"] = held.upstream_id
        rid = response_id("resp_")
        stored_upstream = upstream.get("store") is not False

        async def remember(upstream_id: str | None, channel: ChannelConfig) -> None:
            if stored_upstream and upstream_id:
                await state.store.remember_response(
                    ResponseState(
                        id=rid,
                        account_id=call.ctx.account.id,
                        model=model.name,
                        channel_url=channel.base_url,
                        upstream_id=upstream_id,
                        expires_at_ms=now_ms() + STATE_TTL_MS,
                    )
                )

        if payload.get("stream") is True:
            return await forward_stream(
                state,
                request,
                call,
                model,
                json_body(upstream),
                rid,
                lambda: ResponsesStreamRewriter(rid, previous),
                lambda: _prompt_tokens(model, payload),
                error_event=b"event: error\n",
                only=only,
                on_start=lambda rewriter, channel: remember(rewriter.upstream_id, channel),
            )

        answered = await call_upstream(state, request, call, model, json_body(upstream), only=only)
        content = answered.content
        try:
            answer = rewrite_response(content, rid, previous)
            usage = (
                reported_usage(answer.usage)
                if answer.usage is not None
                else Usage(
                    _prompt_tokens(model, payload), count_tokens(_output_text(answer.body), model.tokenizer)
                )
            )
        except (InvalidJsonError, orjson.JSONDecodeError) as exc:
            raise GatewayError("provider_error", "The model's provider sent a malformed answer.") from exc
        # Charged first: the model has run, so its cost is kept even if keeping the state fails.
        charged = billing.settle(state, call, model, rid, "completed", usage)
        await remember(answer.upstream_id, answered.channel)
        return Response(
            answer.body,
            media_type="application/json",
            headers={REQUEST_ID_HEADER: call.request_id, "x-service-cost": format_cost(charged)},
        )

    return [Route("/v1/responses", model_endpoint(state, responses), methods=["POST"])]


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
    if "stream" in payload and not isinstance(payload["stream"], bool | None):
        raise invalid_request("`stream` must be a boolean.", "stream")


def _channel_holding(model: ModelConfig, held: ResponseState) -> ChannelConfig:
    """The model's channel on the upstream that holds the previous response's state."""
    for channel in model.channels:
        if channel.base_url == held.channel_url:
            return channel
    raise invalid_request(
        f"Response {held.id!r} was made by {held.model!r}, whose upstream holds its state; "
        f"{model.name!r} cannot reach it. Continue the conversation with {held.model!r}.",
        "previous_response_id",
    )


def _prompt_tokens(model: ModelConfig, payload: dict[str, Any]) -> int:
    """The gateway's own count of this turn's input (only used when the upstream reports no usage;
    earlier turns held upstream cannot be counted here)."""
    messages: list[dict[str, str]] = []
    if isinstance(payload.get("instructions"), str):
        messages.append({"role": "system", "content": payload["instructions"]})
    value = payload.get("input")
    if isinstance(value, str):
        messages.append({"role": "user", "content": value})
    for item in value if isinstance(value, list) else []:
        role = item.get("role") if isinstance(item.get("role"), str) else "user"
        messages.append({"role": role, "content": _item_text(item)})
    return count_chat_tokens(orjson.dumps({"messages": messages}), model.tokenizer)


def _item_text(item: dict[str, Any]) -> str:
    """The text of one input or output item: message content, reasoning summary, tool call or output."""
    parts: list[str] = []
    for key in ("content", "summary"):
        value = item.get(key)
        if isinstance(value, str):
            parts.append(value)
        for part in value if isinstance(value, list) else []:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
    parts.extend(item[k] for k in ("name", "arguments", "output") if isinstance(item.get(k), str))
    return "".join(parts)


def _output_text(body: bytes) -> str:
    data = orjson.loads(body)
    output = data.get("output") if isinstance(data, dict) else None
    return "".join(_item_text(item) for item in output or [] if isinstance(item, dict))

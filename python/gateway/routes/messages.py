"""POST /v1/messages (Shape B): the message-style API, for models of that family."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .. import billing
from ..config import ModelConfig
from ..context import Call
from ..core import (
    MessagesStreamRewriter,
    count_prompt_tokens,
    count_tokens,
)
from ..errors import MESSAGES_PATHS, invalid_request
from ..ids import response_id
from ..pricing import Usage
from ..state import GatewayState
from ..stream_errors import messages_error_event
from ..translate import (
    MessagesStreamFromChat,
    chat_request_from_messages,
    message_from_chat_completion,
    message_output_text,
)
from ..translate.chat_request import FROM_MESSAGES
from ..translate.usage import messages_usage
from .common import REQUEST_ID_HEADER, json_response, model_endpoint, parse_object, read_body, resolve_model
from .streaming import forward_stream
from .text import check_and_hold, count_prompt
from .translated import chat_body, forward_to_chat_model
from .upstream import MESSAGES_ANSWER, answer_with_usage, forward_plain

WITH_MESSAGES_USAGE = answer_with_usage(messages_usage)


def routes(state: GatewayState) -> list[Route]:
    async def messages(request: Request, call: Call) -> Response:
        payload = parse_object(await read_body(request, state.settings.max_request_bytes))
        model = resolve_model(state, call, payload.get("model"), "messages")
        _validate(payload)
        if model.type == "chat":
            return await _from_chat_model(state, request, call, model, payload)
        received = state.registry.received_fields(model)
        billing.cap_output(received, model, payload, "max_tokens")
        prompt = await _check_and_hold(state, request, call, model, payload)
        billing.send_output_limit(received, model, payload, "max_tokens")
        upstream = state.registry.channel_body(model, payload, call)
        rid = response_id("msg_")
        if payload.get("stream") is True:
            return await forward_stream(
                state,
                request,
                call,
                model,
                upstream,
                rid,
                lambda: MessagesStreamRewriter(rid),
                prompt,
                error_event=messages_error_event,
            )
        return await forward_plain(
            state,
            request,
            call,
            model,
            upstream,
            rid,
            MESSAGES_ANSWER,
            lambda body: Usage(prompt, count_tokens(message_output_text(body), model.tokenizer)),
            add_usage=WITH_MESSAGES_USAGE,
        )

    async def count_message_tokens(request: Request, call: Call) -> Response:
        """Anthropic's token counting (the anthropic client's `messages.count_tokens`): the
        gateway's own count of the prompt, the one a request's hold is made from. Free: nothing
        goes upstream, nothing is charged; but, as every model request, refused when the account's
        balance is at or below zero (spec 7.5.1: free models too)."""
        payload = parse_object(await read_body(request, state.settings.max_request_bytes))
        model = resolve_model(state, call, payload.get("model"), "messages")
        _validate_messages(payload)
        if model.type != "messages":  # what /v1/messages would refuse to translate is refused here too
            asked = {**payload, "max_tokens": payload.get("max_tokens") or 1}  # counting needs none
            chat_body(
                state,
                model,
                asked,
                call,
                chat_request_from_messages,
                "max_tokens",
                "messages",
                FROM_MESSAGES,
            )
        await billing.hold(state, call, model, Usage())  # nothing set aside; names the model too
        tokens, _ = await count_prompt(request, lambda: _prompt_tokens(model, payload))
        return json_response({"input_tokens": tokens}, headers={REQUEST_ID_HEADER: call.request_id})

    served = model_endpoint(state, messages)
    counted = model_endpoint(state, count_message_tokens)
    return [
        *(Route(path, served, methods=["POST"]) for path in MESSAGES_PATHS),
        *(Route(path + "/count_tokens", counted, methods=["POST"]) for path in MESSAGES_PATHS),
    ]


async def _check_and_hold(
    state: GatewayState, request: Request, call: Call, model: ModelConfig, payload: dict[str, Any]
) -> int:
    return await check_and_hold(
        state, request, call, model, payload, "messages", lambda: _prompt_tokens(model, payload), "max_tokens"
    )


async def _from_chat_model(
    state: GatewayState, request: Request, call: Call, model: ModelConfig, payload: dict[str, Any]
) -> Response:
    """A chat model in the message shape (routes/translated.py)."""
    upstream = chat_body(
        state, model, payload, call, chat_request_from_messages, "max_tokens", "messages", FROM_MESSAGES
    )
    prompt = await _check_and_hold(state, request, call, model, payload)
    rid = response_id("msg_")
    return await forward_to_chat_model(
        state,
        request,
        call,
        model,
        payload,
        upstream,
        rid,
        prompt,
        new_stream=lambda counted: MessagesStreamFromChat(rid, counted),
        from_chat=message_from_chat_completion,
        error_event=messages_error_event,
    )


def _validate(payload: dict[str, Any]) -> None:
    _validate_messages(payload)
    max_tokens = payload.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise invalid_request("`max_tokens` is required and must be a positive integer.", "max_tokens")
    if "stream" in payload and not isinstance(payload["stream"], bool):
        raise invalid_request("`stream` must be a boolean.", "stream")


def _validate_messages(payload: dict[str, Any]) -> None:
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise invalid_request("`messages` must be a non-empty array of objects.", "messages")


def _prompt_tokens(model: ModelConfig, payload: dict[str, Any]) -> tuple[int, int]:
    """The gateway's own count of a messages prompt: the system text plus the messages, the tools
    and a structured output's schema, counted as chat messages are (for the hold, and the bill
    when the upstream reports no usage)."""
    messages = list(payload.get("messages") or [])
    system = payload.get("system")
    if isinstance(system, (str, list)):  # a string, or text blocks
        messages.insert(0, {"role": "system", "content": system})
    # A structured output's schema is prompt too (`output_format`, or `output_config` now), as the
    # chat shape's response_format is.
    schema = [payload.get(k) for k in ("output_format", "output_config") if payload.get(k) is not None]
    counted = {"messages": messages, "tools": payload.get("tools"), "response_format": schema or None}
    return count_prompt_tokens(orjson.dumps(counted), model.tokenizer, model.image_tokens)

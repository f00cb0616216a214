"""POST /v1/chat/completions (Shape A), plain and streamed."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .. import billing
from ..config import ModelConfig
from ..context import Call
from ..core import (
    ChatStreamRewriter,
    count_prompt_tokens,
    count_tokens,
)
from ..errors import invalid_request
from ..ids import response_id
from ..pricing import Usage
from ..registry import name_as_sent, note_dropped
from ..routing import ChannelBody, json_body
from ..state import GatewayState
from ..translate import (
    ChatStreamFromMessages,
    chat_completion_from_message,
    chat_output_text,
    message_output_text,
    messages_request_from_chat,
)
from ..translate.messages_request import FROM_CHAT
from ..translate.usage import chat_usage
from .common import model_endpoint, parse_object, read_body, resolve_model
from .streaming import forward_stream, stream_outcome
from .text import check_and_hold
from .upstream import CHAT_ANSWER, MESSAGES_ANSWER, answer_with_usage, forward_plain

WITH_CHAT_USAGE = answer_with_usage(chat_usage)


def routes(state: GatewayState) -> list[Route]:
    async def chat_completions(request: Request, call: Call) -> Response:
        raw = await read_body(request, state.settings.max_request_bytes)
        payload = parse_object(raw)
        model = resolve_model(state, call, payload.get("model"), "chat")
        _validate(payload)
        forwarded = state.registry.forwarded_params(model)
        received = state.registry.received_fields(model)
        limits = billing.cap_output(received, model, payload, "max_completion_tokens", "max_tokens")
        # A messages-family model gets the request as a message request, translated before the
        # safety check and the hold: one that cannot be translated is a 400 that has cost nothing.
        translated = None
        if model.type == "messages":
            translated = state.registry.channel_body(
                model, messages_request_from_chat(payload, model.max_output_tokens), call
            )
            name_as_sent(call, FROM_CHAT.field_of)  # the model's drops, then the translation's
            note_dropped(call, payload, FROM_CHAT.read)
        if model.name in state.registry.checked:  # said in another API (Bedrock, Gemini): checked now
            state.registry.check(model, payload)
        prompt = await check_and_hold(
            state,
            request,
            call,
            model,
            payload,
            "chat",
            lambda: count_prompt_tokens(raw, model.tokenizer, model.image_tokens, model.max_output_tokens),
            *limits,  # the one the client set first: a refusal names it
        )
        if translated is not None:
            return await _from_messages_model(state, request, call, model, prompt, payload, translated)

        billing.send_output_limit(received, model, payload, "max_completion_tokens", "max_tokens")
        upstream = state.registry.upstream_body(model, payload, call)
        rid = response_id("chatcmpl-")
        if payload.get("stream") is not True:
            return await forward_plain(
                state,
                request,
                call,
                model,
                json_body(upstream),
                rid,
                CHAT_ANSWER,
                lambda body: _counted_usage(model, prompt, chat_output_text(body), call.prompt_audio),
                add_usage=WITH_CHAT_USAGE,
            )

        options = payload.get("stream_options")
        client_wants_usage = _wants_usage(payload)
        if "stream_options" in forwarded:
            # Ask for usage even when the client did not, to bill from the upstream's own count;
            # the rewriter then keeps that usage chunk from the client.
            upstream["stream_options"] = {
                **(options if isinstance(options, dict) else {}),
                "include_usage": True,
            }
        return await forward_stream(
            state,
            request,
            call,
            model,
            json_body(upstream),
            rid,
            lambda: ChatStreamRewriter(rid, client_wants_usage),
            prompt,
            on_end=_usage_end(model, call, rid, prompt) if client_wants_usage else None,
        )

    return [Route("/v1/chat/completions", model_endpoint(state, chat_completions), methods=["POST"])]


def _usage_end(
    model: ModelConfig, call: Call, rid: str, prompt: int
) -> Callable[[ChatStreamRewriter], Awaitable[bytes]]:
    """The end of a stream whose client asked for usage (include_usage, spec 6.1.4) and whose
    upstream sent none (it takes no `stream_options`, or never counts): a last chunk with the
    gateway's own count, the one the stream is billed (spec 1.4.1), then the `[DONE]` the rewriter
    held back. Nothing when the upstream's usage came."""

    async def end(rewriter: ChatStreamRewriter) -> bytes:
        if not rewriter.awaits_usage:
            return b""
        outcome = stream_outcome(rewriter, call, prompt, rewriter.output_len, True)
        chunk = {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": rewriter.model or model.name,
            "choices": [],
            "usage": chat_usage(billing.stream_usage(model, outcome)),
        }
        return b"data: " + orjson.dumps(chunk) + b"\n\ndata: [DONE]\n\n"

    return end


async def _from_messages_model(
    state: GatewayState,
    request: Request,
    call: Call,
    model: ModelConfig,
    prompt: int,
    payload: dict[str, Any],
    upstream: ChannelBody,
) -> Response:
    """A messages-family model in the chat shape: the request goes out as a message request
    (`upstream`), the answer or stream comes back as chat completions (gateway.translate), billed
    from the upstream's own usage."""
    rid = response_id("chatcmpl-")
    created = int(time.time())
    if payload.get("stream") is not True:
        return await forward_plain(
            state,
            request,
            call,
            model,
            upstream,
            rid,
            MESSAGES_ANSWER,
            lambda body: _counted_usage(model, prompt, message_output_text(body)),
            to_client=lambda body, usage: orjson.dumps(
                chat_completion_from_message(orjson.loads(body), usage, created)
            ),
        )

    def translator() -> ChatStreamFromMessages:
        return ChatStreamFromMessages(
            rid, _wants_usage(payload), created, lambda text: _counted_usage(model, prompt, text)
        )

    return await forward_stream(
        state,
        request,
        call,
        model,
        upstream,
        rid,
        translator,
        prompt,
    )


def _wants_usage(payload: dict[str, Any]) -> bool:
    options = payload.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def _validate(payload: dict[str, Any]) -> None:
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid_request("`messages` must be a non-empty array.", "messages")
    for message in messages:  # a loop, not all() over a generator: a third of the instructions
        if not isinstance(message, dict):
            raise invalid_request("Every entry of `messages` must be an object.", "messages")
    if "stream" in payload and not isinstance(payload["stream"], bool | None):
        raise invalid_request("`stream` must be a boolean.", "stream")
    options = payload.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise invalid_request("`stream_options` must be an object.", "stream_options")
        if not isinstance(options.get("include_usage"), bool | None):
            raise invalid_request(
                "`stream_options.include_usage` must be a boolean.", "stream_options.include_usage"
            )


def _counted_usage(model: ModelConfig, prompt: int, output_text: str, audio: int = 0) -> Usage:
    """Usage counted by the gateway (the prompt as counted for the hold, `audio` of it its audio's
    tokens), for an upstream that reported none."""
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=count_tokens(output_text, model.tokenizer),
        audio_prompt_tokens=audio,
    )

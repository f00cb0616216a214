"""A chat model served on another text endpoint (/v1/messages, /v1/responses): the request goes out
as chat completions, the answer or the stream comes back in the endpoint's shape (gateway.translate),
billed from the upstream's own usage, or from the gateway's count when it reports none."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from .. import billing
from ..config import ModelConfig
from ..context import Call
from ..core import count_tokens
from ..pricing import Usage
from ..routing import ChannelBody
from ..state import GatewayState
from ..stream_errors import StreamErrorRenderer
from ..translate import (
    ChatStreamFromMessages,
    chat_completion_from_message,
    chat_output_text,
    message_output_text,
    messages_request_from_chat,
)
from ..translate.chained import MessagesThroughChat
from ..translate.stream_base import FromChatStream
from .streaming import forward_stream
from .upstream import CHAT_ANSWER, MESSAGES_ANSWER, forward_plain

# The shape's request as a chat completions request, told where the token limit goes.
ToChat = Callable[[dict[str, Any], str], dict[str, Any]]
# The shape's stream translator, given the gateway's own count of the output (as Usage).
NewStream = Callable[[Callable[[str], Usage]], FromChatStream]
# A whole chat completion as the shape's answer, with the usage billed.
FromChat = Callable[[dict[str, Any], Usage], dict[str, Any]]


def chat_body(
    state: GatewayState, model: ModelConfig, payload: dict[str, Any], call: Call, to_chat: ToChat
) -> ChannelBody:
    """The request as a chat completions request for `model`. Made before the safety check and the
    hold: a request that cannot be translated is a 400 that has cost nothing."""
    # max_completion_tokens where the model takes it (OpenAI's reasoning models refuse max_tokens).
    forwarded = state.registry.forwarded_params(model)
    limit = "max_completion_tokens" if "max_completion_tokens" in forwarded else "max_tokens"
    chat = to_chat(payload, limit)
    billing.cap_output(forwarded, model, chat, limit, "max_tokens")
    if model.type == "messages":  # once more, into the model's own shape
        return state.registry.channel_body(
            model, messages_request_from_chat(chat, model.max_output_tokens), call
        )
    return state.registry.channel_body(model, chat, call)


async def forward_to_chat_model(
    state: GatewayState,
    request: Request,
    call: Call,
    model: ModelConfig,
    payload: dict[str, Any],
    upstream: ChannelBody,
    rid: str,
    counted_prompt: int,
    *,
    new_stream: NewStream,
    from_chat: FromChat,
    error_event: StreamErrorRenderer,
    on_end: Callable[[FromChatStream], Awaitable[bytes]] | None = None,
    on_answer: Callable[[bytes], Awaitable[bytes]] | None = None,
) -> Response:
    """`upstream` is chat_body's; the answer or stream comes back in the endpoint's shape.
    `counted_prompt` is check_and_hold's count, billed when the upstream reports no usage.
    `on_end` (forward_stream's) and `on_answer` (forward_plain's) run once the whole answer is
    known, before the client has all of it (the route keeps it: routes/kept_responses.py)."""

    def counted_usage(output_text: str) -> Usage:
        return Usage(counted_prompt, count_tokens(output_text, model.tokenizer))

    if model.type == "messages":
        return await _from_messages_model(
            state,
            request,
            call,
            model,
            payload,
            upstream,
            rid,
            counted_prompt,
            counted_usage,
            new_stream=new_stream,
            from_chat=from_chat,
            error_event=error_event,
            on_end=on_end,
            on_answer=on_answer,
        )
    if payload.get("stream") is True:
        return await forward_stream(
            state,
            request,
            call,
            model,
            upstream,
            rid,
            lambda: new_stream(counted_usage),
            counted_prompt,
            error_event=error_event,
            on_end=on_end,
        )
    return await forward_plain(
        state,
        request,
        call,
        model,
        upstream,
        rid,
        CHAT_ANSWER,
        lambda body: counted_usage(chat_output_text(body)),
        to_client=lambda body, usage: orjson.dumps(from_chat(orjson.loads(body), usage)),
        on_answer=on_answer,
    )


async def _from_messages_model(
    state: GatewayState,
    request: Request,
    call: Call,
    model: ModelConfig,
    payload: dict[str, Any],
    upstream: ChannelBody,
    rid: str,
    counted_prompt: int,
    counted_usage: Callable[[str], Usage],
    *,
    new_stream: NewStream,
    from_chat: FromChat,
    error_event: StreamErrorRenderer,
    on_end: Callable[[FromChatStream], Awaitable[bytes]] | None,
    on_answer: Callable[[bytes], Awaitable[bytes]] | None,
) -> Response:
    """A messages model on another shape's endpoint: its answer (or its stream's events) through
    the chat shape into the endpoint's, billed from the upstream's own usage (cache writes too)."""
    created = int(time.time())
    if payload.get("stream") is True:

        def chained() -> MessagesThroughChat:
            return MessagesThroughChat(
                ChatStreamFromMessages(rid, True, created, counted_usage), new_stream(counted_usage)
            )

        return await forward_stream(
            state,
            request,
            call,
            model,
            upstream,
            rid,
            chained,
            counted_prompt,
            error_event=error_event,
            on_end=None if on_end is None else lambda stream: on_end(stream.shape),
        )

    def to_client(body: bytes, usage: Usage) -> bytes:
        completion = chat_completion_from_message(orjson.loads(body), usage, created)
        return orjson.dumps(from_chat(completion, usage))

    return await forward_plain(
        state,
        request,
        call,
        model,
        upstream,
        rid,
        MESSAGES_ANSWER,
        lambda body: counted_usage(message_output_text(body)),
        to_client=to_client,
        on_answer=on_answer,
    )

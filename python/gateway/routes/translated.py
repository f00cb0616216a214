"""A chat model served on another text endpoint (/v1/messages, /v1/responses): the request goes out
as chat completions, the answer or the stream comes back in the endpoint's shape (gateway.translate),
billed from the upstream's own usage, or from the gateway's count when it reports none."""

from __future__ import annotations

import re
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
from ..errors import GatewayError
from ..pricing import Usage
from ..providers.base import UpstreamRefusal
from ..registry import name_as_sent, note_dropped
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
from ..translate.carried import Carried
from ..translate.chained import MessagesThroughChat
from ..translate.messages_request import FROM_CHAT
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
    state: GatewayState,
    model: ModelConfig,
    payload: dict[str, Any],
    call: Call,
    to_chat: ToChat,
    source_limit: str,
    conversation: str,
    carried: Carried,
) -> ChannelBody:
    """The request as a chat completions request for `model`. Made before the safety check and the
    hold: a request that cannot be translated is a 400 that has cost nothing. `source_limit` is
    the request shape's output limit, which the hold reads from `payload`; `conversation` the
    field that holds its turns, which a refusal of what they hold names; `carried` what `to_chat`
    carries of `payload` (the rest is noted as dropped, with what the model drops, all by the
    request's own names)."""
    # max_completion_tokens where the model takes it (OpenAI's reasoning models refuse max_tokens).
    received = state.registry.received_fields(model)
    limit = "max_completion_tokens" if "max_completion_tokens" in received else "max_tokens"
    chat = to_chat(payload, limit)
    billing.cap_output(received, model, chat, limit, "max_tokens")
    billing.send_output_limit(received, model, chat, limit, "max_tokens")  # the hold reads `payload`
    if limit not in received:  # the model takes no output limit: it is held at its most
        payload.pop(source_limit, None)
    try:
        if model.type == "messages":  # once more, into the model's own shape
            body = state.registry.channel_body(
                model, messages_request_from_chat(chat, model.max_output_tokens), call
            )
            # What each step dropped, named back one shape at a time, the request's own last.
            name_as_sent(call, FROM_CHAT.field_of)
            note_dropped(call, chat, FROM_CHAT.read)
            name_as_sent(call, carried.field_of)
            note_dropped(call, payload, carried.read)
            return body
        if model.name in state.registry.checked:  # said in another API (Bedrock, Gemini)
            state.registry.check(model, chat)
    except GatewayError as exc:
        if exc.param is not None and exc.param.startswith("messages"):
            # It names the chat request made in between: the client's conversation is its own.
            exc.param = conversation
            exc.message = _CHAT_PATH.sub("", exc.message, count=1)
        raise
    body = state.registry.channel_body(model, chat, call)
    name_as_sent(call, carried.field_of)
    note_dropped(call, payload, carried.read)
    return body


# A refusal's leading "`messages[2].content[0]...`: ", the place in the chat request made in between.
_CHAT_PATH = re.compile(r"^`messages[^`]*`: ")


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

    # A messages model answers in its own shape: through the chat shape into the endpoint's
    # (its stream by a second translator; billed from its own usage, cache writes too).
    messages = model.type == "messages"
    created = int(time.time())
    forwarding: Awaitable[Response]
    if payload.get("stream") is True:

        def translator() -> FromChatStream | MessagesThroughChat:
            shape = new_stream(counted_usage)
            if not messages:
                return shape
            return MessagesThroughChat(ChatStreamFromMessages(rid, True, created, counted_usage), shape)

        async def end(rewriter: FromChatStream | MessagesThroughChat) -> bytes:
            assert on_end is not None
            return await on_end(rewriter.shape if isinstance(rewriter, MessagesThroughChat) else rewriter)

        forwarding = forward_stream(
            state,
            request,
            call,
            model,
            upstream,
            rid,
            translator,
            counted_prompt,
            error_event=error_event,
            on_end=None if on_end is None else end,
        )
    else:

        def to_client(body: bytes, usage: Usage) -> bytes:
            answer = orjson.loads(body)
            completion = chat_completion_from_message(answer, usage, created) if messages else answer
            return orjson.dumps(from_chat(completion, usage))

        forwarding = forward_plain(
            state,
            request,
            call,
            model,
            upstream,
            rid,
            MESSAGES_ANSWER if messages else CHAT_ANSWER,
            lambda body: counted_usage(message_output_text(body) if messages else chat_output_text(body)),
            to_client=to_client,
            on_answer=on_answer,
        )
    try:
        return await forwarding
    except UpstreamRefusal as refused:
        # Its `param` names a field of the chat request made in between, not of the client's.
        refused.param = None
        raise

"""The one flow of a plain (non-streamed) model request: send, read, stamp the gateway's id, price,
settle, answer. Every endpoint that answers with one JSON body goes through here."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, Literal, NamedTuple

import orjson
from starlette.requests import Request
from starlette.responses import Response

from .. import billing
from ..clock import instant_ns
from ..config import ChannelConfig, ModelConfig
from ..context import Call
from ..core import InvalidJsonError, set_json_id, stamp_answer
from ..deadline import within
from ..errors import GatewayError
from ..pricing import Usage, format_cost, reported_usage
from ..providers import PROVIDERS
from ..providers.base import is_error_answer, send
from ..providers.http import UPSTREAM_FAILURES, UpstreamResponse
from ..routing import ChannelBody
from ..state import GatewayState
from ..telemetry.tracing import upstream_traceparent
from .common import REQUEST_ID_HEADER, JsonAnswer

# How long before the synchronous window closes an attempt on one channel gives up.
ATTEMPT_MARGIN_SECONDS = 0.5


# What forward_plain does with the upstream's answer: the answer with the gateway's id (`rid`)
# stamped on it, and the usage it reports (None: it reports none).
AnswerReader = Callable[[bytes, str], tuple[bytes, Usage | None]]


def _core_reader(shape: Literal["chat", "messages"]) -> AnswerReader:
    def read(content: bytes, rid: str) -> tuple[bytes, Usage | None]:
        body, reported = stamp_answer(content, rid, shape)
        return body, None if reported is None else reported_usage(reported)

    return read


# Answers of OpenAI's usage shape (chat completions, embeddings, moderations) and of Anthropic's
# (messages): stamped and their usage read in one pass of the core over the body.
CHAT_ANSWER: Final = _core_reader("chat")
MESSAGES_ANSWER: Final = _core_reader("messages")


def answer_with_usage(shape: Callable[[Usage], dict[str, Any]]) -> Callable[[bytes, Usage], bytes]:
    """forward_plain's `add_usage` for an answer whose usage is `shape(usage)` (chat_usage,
    messages_usage): every successful answer carries its usage (spec 1.4.1), the gateway's count,
    as billed, where the upstream reported none."""

    def add(body: bytes, usage: Usage) -> bytes:
        answer = orjson.loads(body)
        if not isinstance(answer, dict) or answer.get("usage") is not None:
            return body
        answer["usage"] = shape(usage)
        return orjson.dumps(answer)

    return add


def stamped_answer(parse_usage: Callable[[bytes], Usage | None]) -> AnswerReader:
    """An answer whose usage Python reads (`parse_usage` of the stamped answer)."""

    def read(content: bytes, rid: str) -> tuple[bytes, Usage | None]:
        body = set_json_id(content, rid)
        return body, parse_usage(body)

    return read


async def open_stream(
    state: GatewayState,
    request: Request,
    model: ModelConfig,
    channel: ChannelConfig,
    body: ChannelBody,
    *,
    head_within: float | None = None,
) -> UpstreamResponse:
    """Send to one channel for an answer read as it arrives (a text stream, audio): the stream idle
    window applies between reads, not the synchronous window. With `head_within`, the answer's head
    is waited for that long instead (a synchronous answer whose body flows: speech), the idle
    window applying from the head on."""
    provider = PROVIDERS[channel.provider]
    url = provider.url(channel, model.type, stream=True)
    payload = provider.encode(channel, model.type, body(channel))
    headers = await provider.headers(channel, request.headers, state.upstream, url=url, body=payload)
    headers["traceparent"] = upstream_traceparent(request.scope)
    idle = state.settings.stream_idle_timeout_seconds
    answer = await send(
        state.upstream,
        url,
        payload,
        headers,
        stream=True,
        read_timeout=idle if head_within is None else head_within,
    )
    if head_within is not None:
        answer.allow_silence(idle)
    return answer


def window_left(state: GatewayState, call: Call) -> float:
    """Seconds left of the request's synchronous window (spec 8: from its start, its body's
    arrival included)."""
    return state.settings.sync_timeout_seconds - (instant_ns() - call.started_ns) / 1e9


def window_closed(state: GatewayState) -> GatewayError:
    """The answer to a wait for the upstream ended by its time: 504 timeout when the synchronous
    window closed; 503 service_unavailable when a draining worker's last moment ended it (its
    waits run under the window's length: gateway.drain's finals)."""
    if state.drain.cut:
        return GatewayError(
            "service_unavailable",
            "The gateway is shutting down: the request was ended before its answer came. Retry.",
            headers={"Retry-After": "1"},
        )
    # Spec 8: "then connection closed and 504 timeout".
    return GatewayError(
        "timeout",
        "The request ran past the synchronous time window.",
        status=504,
        headers={"connection": "close"},
    )


class UpstreamAnswer(NamedTuple):
    content: bytes
    content_type: str
    channel: ChannelConfig  # the channel that answered


async def call_upstream(
    state: GatewayState,
    request: Request,
    call: Call,
    model: ModelConfig,
    body: ChannelBody,
    content_type: str | None = None,
    operation: str | None = None,
    only: ChannelConfig | None = None,
    replayable: bool = True,
) -> UpstreamAnswer:
    """Send to one of the model's channels (gateway.routing: retried and failed over there) and
    read the whole answer, all within the synchronous window (spec 8), or raise the spec's error.
    `operation` names the upstream endpoint when a model type has several (image_edit); by default
    it is the type's own. `only` pins the request to the channel that holds its state. A request
    that is not `replayable` (it creates a job upstream) is never sent twice."""

    window = state.settings.sync_timeout_seconds
    # The window runs from the request's start (spec 8), its body's arrival included: the attempts
    # end by then (the monotonic clock, as the start is: gateway.clock); `within(window)` below,
    # one length for every request, is only the backstop.
    deadline = call.started_ns / 1e9 + window
    longest = state.settings.routing.attempt_timeout_seconds or window
    margin = min(ATTEMPT_MARGIN_SECONDS, window / 4)

    async def attempt(channel: ChannelConfig) -> UpstreamAnswer:
        # Each attempt gives up a moment before the request's window closes (or after [routing]
        # attempt_timeout_seconds): its own timeout is then a failure of the channel
        # (gateway.routing: counted, cooled down), where the window's would only cancel it.
        left = deadline - time.monotonic() - margin
        left = longest if left > longest else left  # not min(): ten times the instructions
        if left <= 0:
            raise TimeoutError  # the window is spent: the answer is 504
        provider = PROVIDERS[channel.provider]
        kind = operation or model.type
        url = provider.url(channel, kind)
        asked = body(channel)
        payload = provider.encode(channel, kind, asked)
        headers = await provider.headers(channel, request.headers, state.upstream, url=url, body=payload)
        headers["traceparent"] = upstream_traceparent(request.scope)
        if content_type is not None:
            headers["content-type"] = content_type
        response = await send(
            state.upstream,
            url,
            payload,
            headers,
            stream=False,
            read_timeout=left,
            replayable=replayable,
        )
        try:
            content = await response.read()
        except UPSTREAM_FAILURES as exc:
            raise GatewayError(
                "provider_error", "The model's answer broke off.", retry="any" if replayable else "never"
            ) from exc
        finally:
            response.release()
        if is_error_answer(content):
            raise GatewayError(
                "provider_error",
                "The model's provider answered with an error instead of a result.",
                retry="any" if replayable else "never",
            )
        answered_as = response.headers.get("content-type", "application/json")
        return UpstreamAnswer(provider.decode(channel, kind, content, asked), answered_as, channel)

    started = time.perf_counter_ns()
    try:
        with within(window):
            answer, slot = await state.router.run(model, attempt, call.attempts, only)
    except TimeoutError as exc:
        raise window_closed(state) from exc
    finally:
        call.upstream_ns += time.perf_counter_ns() - started
    slot.release()
    return answer


async def forward_plain(
    state: GatewayState,
    request: Request,
    call: Call,
    model: ModelConfig,
    upstream_body: ChannelBody,
    rid: str,
    read_answer: AnswerReader,
    count_usage: Callable[[bytes], Usage],
    to_client: Callable[[bytes, Usage], bytes] | None = None,
    on_answer: Callable[[bytes], Awaitable[bytes]] | None = None,
    add_usage: Callable[[bytes, Usage], bytes] | None = None,
) -> Response:
    """`read_answer(answer, rid)` stamps the gateway's id on the upstream's answer and reads the
    usage it reports in its shape (CHAT_ANSWER, MESSAGES_ANSWER, stamped_answer);
    `count_usage(answer)` is the gateway's own count, used only when the upstream reports none.
    `to_client(answer, usage)` turns an answer of the other text shape into the endpoint's
    (gateway.translate); else `add_usage(answer, usage)` gives an answer whose upstream reported
    no usage the gateway's count (answer_with_usage). `on_answer(body)` runs once the answer is
    charged, and what it returns is the answer the client gets."""
    content = (await call_upstream(state, request, call, model, upstream_body)).content
    try:
        body, reported = read_answer(content, rid)
        usage = reported or count_usage(body)
        if to_client is not None:
            body = to_client(body, usage)
        elif reported is None and add_usage is not None:
            body = add_usage(body, usage)
    except (InvalidJsonError, orjson.JSONDecodeError) as exc:
        raise GatewayError("provider_error", "The model's provider sent a malformed answer.") from exc
    charged = billing.settle(state, call, model, rid, "completed", usage)
    if on_answer is not None:
        body = await on_answer(body)
    return JsonAnswer(
        body, headers={REQUEST_ID_HEADER: call.request_id, "x-service-cost": format_cost(charged)}
    )

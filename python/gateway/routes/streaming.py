"""The one flow of a streamed model request, for every text shape: send, hold back until the first
token, pass chunks through the shape's Rust rewriter, end with the spec's error chunk when the model
fails mid-stream, and settle what was streamed (spec 6.1)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Protocol, TypeVar

import orjson
from aiohttp import ClientResponse
from starlette.requests import Request
from starlette.responses import Response

from .. import billing
from .._core import count_tokens
from ..context import Call
from ..config import ChannelConfig, ModelConfig
from ..errors import GatewayError
from ..pricing import Usage
from ..providers.http import UPSTREAM_FAILURES, is_timeout
from ..request_log import STREAM_SUMMARY
from ..routing import ChannelBody
from ..state import GatewayState
from ..stream_errors import StreamErrorRenderer, chat_error_event
from .common import REQUEST_ID_HEADER, HeldStream
from .upstream import ReportedUsage, open_stream, reported_usage

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


class StreamRewriter(Protocol):
    """ChatStreamRewriter and MessagesStreamRewriter from the Rust core, and the shape translators
    ChatStreamFromMessages and MessagesStreamFromChat (gateway.translate)."""

    def feed(self, chunk: bytes) -> bytes: ...
    def finish(self) -> bytes: ...
    @property
    def done(self) -> bool: ...
    @property
    def saw_output(self) -> bool: ...
    @property
    def chunks(self) -> int: ...
    @property
    def output_text(self) -> str: ...
    @property
    def usage(self) -> ReportedUsage | None: ...
    @property
    def error(self) -> bytes | None: ...


R = TypeVar("R", bound=StreamRewriter)


async def forward_stream(
    state: GatewayState,
    request: Request,
    call: Call,
    model: ModelConfig,
    upstream_body: ChannelBody,
    rid: str,
    new_rewriter: Callable[[], R],
    count_prompt: Callable[[], int],
    error_event: StreamErrorRenderer = chat_error_event,
    only: ChannelConfig | None = None,
    on_start: Callable[[R, ChannelConfig], Awaitable[None]] | None = None,
) -> Response:
    """`new_rewriter()` makes the shape's rewriter, afresh for each attempt. `count_prompt()` is the
    gateway's own prompt count, used only when the upstream reports no usage. `error_event`
    renders the final error event in the shape's own format (gateway.stream_errors).
    `only` pins the request to the channel that holds its state. `on_start(rewriter, channel)` runs
    once the stream has started, before the client sees its first byte.

    Until the first token the stream is an attempt like any other (gateway.routing): retried, moved
    to another channel; from the first byte the client sees, never."""

    async def attempt(channel: ChannelConfig) -> tuple[ClientResponse, R, bytes]:
        response = await open_stream(state, request, model, channel, upstream_body)
        rewriter = new_rewriter()
        # Hold the client's bytes back until the first token: an error before it is an ordinary
        # JSON error with its own status (spec 6.1.7), and nothing is billed (6.1.9).
        first = b""
        try:
            while not (rewriter.saw_output or rewriter.done or rewriter.error is not None):
                chunk = await response.content.readany()
                if not chunk:
                    first += rewriter.finish()
                    break
                first += rewriter.feed(chunk)
        except BaseException as exc:
            response.release()
            if is_timeout(exc):
                raise GatewayError(
                    "timeout",
                    "The model sent nothing within the stream idle window.",
                    status=408,
                    retry="other",  # a whole idle window again on this channel is too long a wait
                ) from exc
            if isinstance(exc, UPSTREAM_FAILURES):
                raise GatewayError(
                    "provider_error", "The model's stream broke before it started.", retry="any"
                ) from exc
            raise
        if not rewriter.saw_output and not rewriter.done:
            response.release()
            raise GatewayError("provider_error", "The model's stream failed before it started.", retry="any")
        return response, rewriter, first

    (response, rewriter, first), slot = await state.router.run(model, attempt, call.attempts, only)
    upstream = response.content.iter_any()
    if on_start is not None:
        try:
            await on_start(rewriter, slot.channel)
        except BaseException:
            response.release()
            slot.release()
            raise

    async def body() -> AsyncGenerator[bytes, None]:
        # The error that ends the stream, as (code, message), once the model fails mid-way.
        failure: tuple[str, str] | None = None
        try:
            yield first
            if rewriter.error is None and not rewriter.done:
                async for chunk in upstream:
                    out = rewriter.feed(chunk)
                    if out:
                        yield out
                    if rewriter.error is not None:
                        break
                else:
                    tail = rewriter.finish()
                    if tail:
                        yield tail
            if rewriter.error is not None:
                failure = ("provider_error", "The model failed during the stream.")
            elif not rewriter.done:
                failure = ("provider_error", "The model's stream ended before it was complete.")
        except UPSTREAM_FAILURES as exc:
            if is_timeout(exc):
                failure = ("timeout", "The model sent nothing within the stream idle window.")
            else:
                failure = ("provider_error", "The model's stream broke.")
        finally:
            response.release()  # closes the connection when the body was not read to its end
            _settle(
                state, call, model, rid, rewriter, count_prompt, complete=failure is None and rewriter.done
            )
        if failure is not None:
            call.error_code = failure[0]
            yield error_event(*failure, rewriter.chunks)

    headers = {REQUEST_ID_HEADER: call.request_id, **SSE_HEADERS}

    def summary() -> bytes:
        """What the request log keeps of the stream: what the model said and what it used."""
        usage = rewriter.usage
        return orjson.dumps(
            {
                "object": STREAM_SUMMARY,
                "id": rid,
                "output_text": rewriter.output_text,
                "usage": None
                if usage is None
                else {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens},
                "error": call.error_code,
            }
        )

    def ended() -> None:
        # Also when the body never began (the client left first): the connection goes back now.
        response.release()
        slot.release()
        billing.release(state, call)

    return HeldStream(
        body(),
        ended,
        summary,
        media_type="text/event-stream",
        headers=headers,
    )


def _settle(
    state: GatewayState,
    call: Call,
    model: ModelConfig,
    rid: str,
    rewriter: StreamRewriter,
    count_prompt: Callable[[], int],
    *,
    complete: bool,
) -> None:
    """Spec 6.1.9: a stream is billed for the full prompt plus the output streamed so far; one that
    produced no output is not billed. The upstream's own usage is used when it sent one."""
    reported = rewriter.usage
    if complete and reported is not None:
        usage = reported_usage(reported)
    elif rewriter.saw_output:
        prompt = reported.prompt_tokens if reported is not None and reported.prompt_tokens else count_prompt()
        usage = Usage(
            prompt_tokens=prompt, completion_tokens=count_tokens(rewriter.output_text, model.tokenizer)
        )
    else:
        usage = Usage()
    billing.settle(state, call, model, rid, "completed" if complete else "incomplete", usage)

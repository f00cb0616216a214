"""The one flow of a streamed model request, for every text shape: send, hold back until the first
token, pass chunks through the shape's Rust rewriter, end with the spec's error chunk when the model
fails mid-stream, and settle what was streamed (spec 6.1)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Final, Protocol, TypeVar

import orjson
from starlette.requests import Request
from starlette.responses import Response

from .. import billing, request_log
from ..clock import instant_ns
from ..config import ChannelConfig, ModelConfig
from ..context import Call
from ..deadline import within
from ..drain import CUT_MESSAGE
from ..errors import ErrorCode, GatewayError, unexpected_failure
from ..pricing import ReportedUsage
from ..providers import PROVIDERS, StreamTranslator, reasoning_apart
from ..providers.base import stream_failure
from ..providers.http import UPSTREAM_FAILURES, UpstreamResponse, is_timeout
from ..request_log import STREAM_SUMMARY
from ..routing import ChannelBody
from ..state import GatewayState
from ..store import RequestLog, UsageRecord
from ..stream_errors import StreamErrorRenderer, chat_error_event
from .common import REQUEST_ID_HEADER, HeldStream
from .upstream import open_stream

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
# A chunk without output this soon after the last output (mostly the first piece of an event split
# across reads) leaves the upstream's read timeout as it is: it stretches the idle window by this
# share of it at most, and a stream's split events do not re-arm a timer each.
UNBOUNDED_SHARE: Final = 0.1
# How often a running stream journals what it delivered (see _Progress).
PROGRESS_CHUNKS = 64
PROGRESS_SECONDS = 1.0

log = logging.getLogger("gateway.requests")


class _EndFailed(Exception):
    """forward_stream's on_end failed: the stream ends with this error event instead of its last."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.failure = (code, message)


class _IdleTimeout(Exception):
    """The upstream sent bytes (keep-alives) but no output for the stream idle window."""


IDLE_MESSAGE: Final = "The model sent nothing within the stream idle window."
# The status an attempt whose stream broke after its start is logged with: what the same failure
# before the start is answered (502 provider_error; the idle window's 408 timeout).
_FAILED_STATUS: Final[dict[str, int]] = {"provider_error": 502, "timeout": 408}


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
    def spoken(self) -> bool: ...
    @property
    def chunks(self) -> int: ...
    @property
    def output_text(self) -> str: ...
    @property
    def output_len(self) -> int: ...
    def output_upto(self, mark: int) -> str: ...
    def reasoning_upto(self, mark: int) -> str: ...
    @property
    def usage(self) -> ReportedUsage | None: ...
    @property
    def error(self) -> bytes | None: ...


R = TypeVar("R", bound=StreamRewriter)
# The bound of a stream's wait for its first token as a block the drain can end (drain.waits): far
# past any upstream's idle time, which ends a silent wait first.
FIRST_TOKEN_BOUND_SECONDS: Final = 86_400.0


async def forward_stream(
    state: GatewayState,
    request: Request,
    call: Call,
    model: ModelConfig,
    upstream_body: ChannelBody,
    rid: str,
    new_rewriter: Callable[[], R],
    counted_prompt: int,
    error_event: StreamErrorRenderer = chat_error_event,
    only: ChannelConfig | None = None,
    on_start: Callable[[R, ChannelConfig], Awaitable[None]] | None = None,
    on_end: Callable[[R], Awaitable[bytes]] | None = None,
) -> Response:
    """`new_rewriter()` makes the shape's rewriter, afresh for each attempt. `counted_prompt` is the
    gateway's own prompt count (check_and_hold's), used only when the upstream reports no usage.
    `error_event` renders the final error event in the shape's own format (gateway.stream_errors).
    `only` pins the request to the channel that holds its state. `on_start(rewriter, channel)` runs
    once the stream has started, before the client sees its first byte; `on_end(rewriter)` once the
    rewriter has the whole answer, and what it returns ends the stream (a rewriter made for it holds
    its last events back until then; a failure there ends the stream with an error event).

    Until the first token the stream is an attempt like any other (gateway.routing): retried, moved
    to another channel; from the first byte the client sees, never."""

    idle = state.settings.stream_idle_timeout_seconds
    clock = asyncio.get_running_loop().time

    async def attempt(channel: ChannelConfig) -> tuple[UpstreamResponse, AsyncIterator[bytes], R, bytes]:
        response = await open_stream(state, request, model, channel, upstream_body)
        chunks = _in_shape(response, PROVIDERS[channel.provider].stream_translator(channel, model.type))
        rewriter = new_rewriter()
        # Hold the client's bytes back until the first token: an error before it is an ordinary
        # JSON error with its own status (spec 6.1.7), and nothing is billed (6.1.9).
        first = b""
        since = clock()
        bounded = False  # the upstream's read timeout is what is left of the window
        try:
            while not (rewriter.saw_output or rewriter.done or rewriter.error is not None):
                chunk = await anext(chunks, b"")
                if not chunk:
                    first += rewriter.finish()
                    break
                first += rewriter.feed(chunk)
                if not (rewriter.saw_output or rewriter.done):
                    # Keep-alives are no output (spec 8: "without model output"): an upstream that
                    # only pings is as silent as one that sends nothing (review: it held on).
                    silent = clock() - since
                    if silent > idle:
                        raise _IdleTimeout
                    bounded = bound_silence(response, idle, silent) or bounded
            if bounded and rewriter.saw_output:
                response.allow_silence(idle)  # from its first token, the whole window again
        except BaseException as exc:
            response.release()
            if is_timeout(exc) or isinstance(exc, _IdleTimeout):
                raise GatewayError(
                    "timeout",
                    IDLE_MESSAGE,
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
            raise stream_failure(rewriter.error)
        return response, chunks, rewriter, first

    started = time.perf_counter_ns()
    try:
        # Until its first token a stream has sent nothing: at the drain's deadline it is answered
        # the 503 a plain request gets (review: its worker was stopped with it, and the client got
        # an empty reply, never logged). The block's own bound is never reached: the upstream's
        # idle time ends a silent wait first.
        with within(FIRST_TOKEN_BOUND_SECONDS) as waiting:
            state.drain.waits.add(waiting)
            try:
                (response, upstream, rewriter, first), slot = await state.router.run(
                    model, attempt, call.attempts, only
                )
            finally:
                state.drain.waits.discard(waiting)
    except TimeoutError:
        if not waiting.expired:
            raise
        raise GatewayError(
            "service_unavailable",
            "The gateway is shutting down and the stream had not started (no token yet). Retry.",
            headers={"Retry-After": "1"},
        ) from None
    finally:
        call.upstream_ns += time.perf_counter_ns() - started
    if on_start is not None:
        try:
            await on_start(rewriter, slot.channel)
        except BaseException:
            response.release()
            slot.release()
            raise

    apart = reasoning_apart(slot.channel, model.type)

    def outcome(delivered: int, complete: bool) -> billing.StreamOutcome:
        return stream_outcome(rewriter, call, counted_prompt, delivered, complete, apart)

    async def body() -> AsyncGenerator[bytes, None]:
        # The error that ends the stream, as (code, message), once the model fails mid-way; the
        # same in `channel_failure` when it is the upstream's (not the drain's, nor the route's).
        failure: tuple[ErrorCode, str] | None = None
        channel_failure: tuple[ErrorCode, str] | None = None
        # A `yield` returns once the client was sent its chunk (a client gone raises there
        # instead), so `delivered` marks the output the client was sent: what is billed.
        delivered = 0
        idled = False  # ended by the idle window: the upstream sent bytes but no output
        sent_all = False
        progress = _Progress(time.monotonic())
        ended = False

        async def end(on_end: Callable[[R], Awaitable[bytes]]) -> bytes:
            """on_end's bytes, once, now that the rewriter has the whole answer."""
            nonlocal ended
            if ended:
                return b""
            ended = True
            try:
                return await on_end(rewriter)
            except Exception as exc:
                if not isinstance(exc, GatewayError):  # the route's own failure is said as it is
                    log.exception("request %s: the stream's end failed", call.request_id)
                said = exc if isinstance(exc, GatewayError) else unexpected_failure()
                raise _EndFailed(said.code, said.message) from exc

        # At the drain deadline (gateway.drain) the upstream is closed: the loop below ends there.
        unfollow = state.drain.follow(response.close)
        try:
            head = first + await end(on_end) if on_end is not None and rewriter.done else first
            yield head
            call.first_byte_ns = instant_ns()
            delivered = rewriter.output_len
            progress.sent(len(head))
            billing.note_progress(
                state, call, model, rid, outcome(delivered, False), progress.entry(state, request, call)
            )
            quiet_since = clock()  # the last output's time: keep-alives are none (spec 8)
            bounded = False  # the upstream's read timeout is what is left of the window
            if rewriter.error is None and not rewriter.done:
                async for chunk in upstream:
                    out = rewriter.feed(chunk)
                    if on_end is not None and rewriter.done:  # no coroutine a chunk otherwise
                        out += await end(on_end)
                    spoke = False
                    if out:
                        yield out
                        if rewriter.output_len != delivered:
                            quiet_since = clock()
                            spoke = True
                        delivered = rewriter.output_len
                        if rewriter.done:
                            # The client has the whole answer: what remains is the upstream's
                            # end, and a client that closes now has left nothing unread.
                            sent_all = held.finished = True
                        if progress.sent(len(out)):
                            billing.note_progress(
                                state,
                                call,
                                model,
                                rid,
                                outcome(delivered, False),
                                progress.entry(state, request, call),
                            )
                    if rewriter.error is not None:
                        break
                    if spoke:
                        if bounded:  # output again: the whole window from now
                            bounded = False
                            response.allow_silence(idle)
                    elif not rewriter.done:
                        silent = clock() - quiet_since
                        if silent > idle:
                            idled = True
                            break
                        bounded = bound_silence(response, idle, silent) or bounded
                else:
                    tail = rewriter.finish()
                    if on_end is not None and rewriter.done:
                        tail += await end(on_end)
                    if tail:
                        yield tail
                        delivered = rewriter.output_len
            sent_all = True
            if state.drain.cut and not rewriter.done:
                failure = ("service_unavailable", CUT_MESSAGE)
            elif rewriter.error is not None:
                failure = channel_failure = ("provider_error", "The model failed during the stream.")
            elif idled:
                failure = channel_failure = ("timeout", IDLE_MESSAGE)
            elif not rewriter.done:
                failure = channel_failure = (
                    "provider_error",
                    "The model's stream ended before it was complete.",
                )
        except _EndFailed as failed:
            failure = failed.failure
        except UPSTREAM_FAILURES as exc:
            sent_all = True  # everything the model sent was passed on
            if rewriter.done:
                pass  # broken after its last event: the answer was whole
            elif state.drain.cut:
                failure = ("service_unavailable", CUT_MESSAGE)
            elif is_timeout(exc):
                failure = channel_failure = ("timeout", IDLE_MESSAGE)
            else:
                failure = channel_failure = ("provider_error", "The model's stream broke.")
        finally:
            unfollow()
            response.release()  # closes the connection when the body was not read to its end
            complete = sent_all and failure is None and rewriter.done
            billing.settle_stream(state, call, model, rid, outcome(delivered, complete))
        if failure is not None:
            call.error_code = failure[0]
            if channel_failure is not None and call.attempts:
                # The attempt that started the stream failed after all: its entry in the request
                # log says so (routing review: it read as the channel's success).
                attempt = call.attempts[-1]
                attempt.error, attempt.status = channel_failure[0], _FAILED_STATUS[channel_failure[0]]
            yield error_event(*failure, rewriter.chunks, rid)

    headers = {REQUEST_ID_HEADER: call.request_id, **SSE_HEADERS}

    def summary() -> bytes:
        """What the request log keeps of the stream: what the model said and what it used (as
        billed, once settled: a stream cut early is billed for what it delivered, which its
        upstream's last count, as of the stream's start, may not say)."""
        usage: ReportedUsage | UsageRecord | None = call.settlement or rewriter.usage
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

    held = HeldStream(
        body(),
        ended,
        summary,
        media_type="text/event-stream",
        headers=headers,
    )
    return held


def bound_silence(response: UpstreamResponse, idle: float, silent: float) -> bool:
    """After a chunk without output, `silent` seconds into the `idle` window: a keep-alive
    restarted the upstream's read timeout, so what is left of the window bounds the next read
    instead (review: a ping every P seconds stretched the window by up to P); never 0 s, which is
    no bound at all. Not within the window's first UNBOUNDED_SHARE. Whether it bounded it."""
    if silent <= idle * UNBOUNDED_SHARE:
        return False
    left = idle - silent
    response.allow_silence(left if left > 0.001 else 0.001)
    return True


def stream_outcome(
    rewriter: StreamRewriter,
    call: Call,
    counted_prompt: int,
    delivered: int,
    complete: bool,
    apart: bool = True,
) -> billing.StreamOutcome:
    """What billing reads of a stream whose client was sent the output up to `delivered` (a mark
    of `rewriter.output_len`); `apart` as providers.reasoning_apart says of its channel."""
    return billing.StreamOutcome(
        complete,
        rewriter.usage,
        rewriter.output_upto(delivered),
        counted_prompt,
        rewriter.reasoning_upto(delivered),
        call.prompt_audio,
        rewriter.spoken,
        apart,
    )


def _in_shape(response: UpstreamResponse, translator: StreamTranslator | None) -> AsyncIterator[bytes]:
    """The upstream's stream in the model type's own SSE: as it comes, or through the provider's
    translator (a stream of another framing, as Bedrock's event stream). Never an empty chunk
    before the end."""
    if translator is None:
        return response.content.iter_any()
    return _translated(response, translator)


async def _translated(response: UpstreamResponse, translator: StreamTranslator) -> AsyncIterator[bytes]:
    async for chunk in response.content.iter_any():
        out = translator.feed(chunk)
        if out:
            yield out
    tail = translator.finish()
    if tail:
        yield tail


class _Progress:
    """When a running stream journals its progress (billing.note_progress): after its first output,
    then whenever PROGRESS_CHUNKS chunks or PROGRESS_SECONDS have gone out since the last time, so a
    killed process bills what its streams delivered up to that bound."""

    __slots__ = ("bytes_sent", "chunks", "last")

    def __init__(self, now: float) -> None:
        self.last = now
        self.chunks = 0
        self.bytes_sent = 0

    def sent(self, size: int) -> bool:
        """A chunk went out; whether it is time to journal the progress."""
        self.bytes_sent += size
        self.chunks += 1
        if self.chunks < PROGRESS_CHUNKS and time.monotonic() - self.last < PROGRESS_SECONDS:
            return False
        self.chunks, self.last = 0, time.monotonic()
        return True

    def entry(self, state: GatewayState, request: Request, call: Call) -> RequestLog:
        """The log entry the stream has if its process dies now: cut off by the gateway."""
        return request_log.entry_for(state, request, call, 200, None, self.bytes_sent, "api_error")

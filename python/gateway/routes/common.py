"""What every route shares: the model-endpoint wrapper, body reading and JSON parsing."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from typing import Any, Final

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from .. import billing, idempotency, request_log
from ..auth import authenticate
from ..clock import instant_ns
from ..config import ModelConfig
from ..context import Call
from ..core import json_nesting_depth
from ..deadline import within
from ..drain import Drain
from ..errors import (
    GatewayError,
    ServiceUnavailable,
    error_response,
    invalid_request,
    quoted_id,
    request_too_large,
    unexpected_failure,
)
from ..ids import request_id
from ..pricing import format_cost
from ..providers.http import UPSTREAM_FAILURES
from ..ratelimits import note_rate
from ..registry import ModelRefused
from ..request_log import BodyCapture
from ..runtime_threads import hand_over_now
from ..state import GatewayState
from ..store import Job, KeptAnswer
from ..telemetry import MODEL_REQUEST, endpoint_of
from ..telemetry.tracing import trace


class ClientWatch:
    """Watches a request's connection while it runs (its body has been read, so the server's next
    messages can only be the body's empty closing one, which read_body leaves when the body is as
    long as its content-length, and the disconnect): a client that leaves cancels the task at once,
    the upstream call with it, instead of the gateway learning of it only when it writes.
    `cancels()` says whether leaving still cancels (a request that started a job upstream runs to
    its end).

    Granian's `receive()` is a future that Granian itself resolves with `http.disconnect` once the
    answer has gone out (as ASGI asks), so the watch is a callback on it: no task, nothing to
    cancel when the request ends (the task and its cancellation were ~2% of a request's CPU). A
    receive that is a coroutine (Starlette's test client, the console's in-process calls) is
    awaited in a task of its own, cancelled when the watch stops.

    It is armed once the request first waits (for the upstream, its request already written), not
    when it is made: each `receive()` sets Granian's thread to work on the core the request runs
    on, and before the first wait that work would delay the upstream call. Nothing is missed
    meanwhile: a client gone by then is reported by the first `receive()`."""

    def __init__(self, receive: Receive, cancels: Callable[[], bool] = lambda: True) -> None:
        self.task = asyncio.current_task()
        self.left = False  # the client went away and the task was cancelled for it
        self._active = True
        self._cancels = cancels
        self._receive = receive
        self._waiter: asyncio.Task[None] | None = None
        self._pending: asyncio.Future[Message] | None = None  # the server's receive, watched
        loop = self.task.get_loop() if self.task is not None else asyncio.get_running_loop()
        self._start: asyncio.Handle | None = loop.call_soon(self._first_arm)

    def _first_arm(self) -> None:
        self._start = None
        if self._active:
            self._arm()

    def _arm(self) -> None:
        pending: Any = self._receive()
        if asyncio.isfuture(pending):
            pending.add_done_callback(self._on_message)
            self._pending = pending
        else:
            # A coroutine does nothing until awaited: this one is dropped, the task's is awaited.
            if inspect.iscoroutine(pending):
                pending.close()
            self._waiter = asyncio.ensure_future(_disconnected(self._receive))
            self._waiter.add_done_callback(self._on_done)

    def _on_message(self, done: asyncio.Future[Message]) -> None:
        self._pending = None
        # Any message but the disconnect (only the body's closing one is expected) re-arms.
        if (
            self._active
            and not done.cancelled()
            and done.exception() is None
            and done.result()["type"] != "http.disconnect"
        ):
            self._arm()
            return
        self._on_done(done)

    def _on_done(self, done: asyncio.Future[Any]) -> None:
        # A receive that failed (its exception taken here, so it is not reported as lost) is a
        # connection that broke: the client is gone as well.
        if done.cancelled():
            return
        done.exception()
        if self._active and self._cancels() and self.task is not None:
            self.left = True
            self.task.cancel()

    def stop(self) -> None:
        self._active = False
        if self._start is not None:  # never armed: the request did not wait
            self._start.cancel()
            self._start = None
        if self._pending is not None:
            # Granian resolves the receive once the answer has gone out; without a callback on it
            # that is all it does, where the callback would wake the event loop (a hand-over from
            # Granian's thread) only to find the watch stopped.
            self._pending.remove_done_callback(self._on_message)
            self._pending = None
        if self._waiter is not None:
            self._waiter.cancel()

    def give_up(self) -> None:
        """The client has read nothing of its answer for too long (HeldStream): it is taken as gone,
        as when it leaves, and the request ends."""
        if self._active and self._cancels() and self.task is not None:
            self.left = True
            self.task.cancel()

    def cancelled_for_client(self) -> bool:
        """Inside `except CancelledError`: whether the cancellation was this watch's, the client
        having left (it is then taken back); else it came from elsewhere (the server stopping)."""
        return self.left and self.task is not None and self.task.uncancel() == 0


class HeldStream(StreamingResponse):
    """A streamed answer whose end is known however it comes: its body's own clean-up (reporting
    what it delivered to billing) runs then, even for a client gone mid-way, and so do the `on_end`
    hooks (the upstream connection goes back; the request closes: gateway.billing.close).

    It streams in the request's own task, watched by the ClientWatch the request ran under
    (handed over by model_endpoint, so one receive serves from the request's start to the stream's
    end), rather than in a task group beside a second disconnect listener as Starlette's
    StreamingResponse does: the answer's head and first chunk go out without waiting for another
    task to be scheduled."""

    def __init__(
        self,
        content: AsyncGenerator[bytes, None],
        on_end: Callable[[], None] | None = None,
        summary: Callable[[], bytes] | None = None,
        **kwargs: Any,
    ) -> None:
        self._content = content
        self._tee = self._copy(content)
        super().__init__(self._tee, **kwargs)
        self._on_end: list[Callable[[], Awaitable[None] | None]] = [on_end] if on_end is not None else []
        # What the request log keeps of it: `summary()` when given (a text stream: what it said,
        # not every event), else the bytes `capture` keeps.
        self.summary = summary
        self.capture: BodyCapture | None = None
        self.sent = 0
        self.finished = False  # the body was read to its end (else the client left mid-way)
        self.watch: ClientWatch | None = None
        # A client that takes nothing of the stream for this long is given up (SendStall).
        self.send_idle_seconds = SEND_IDLE_SECONDS

    def when_done(self, hook: Callable[[], Awaitable[None] | None]) -> None:
        self._on_end.append(hook)

    async def _copy(self, content: AsyncGenerator[bytes, None]) -> AsyncGenerator[bytes, None]:
        async for chunk in content:
            self.sent += len(chunk)
            if self.capture is not None:
                self.capture.add(chunk)
            yield chunk
        self.finished = True

    async def collect(self) -> bytes:
        """The whole body, read here rather than sent as it comes (an answer to be kept before it
        goes out); the body's clean-up and the hooks run as when it is sent."""
        if self.watch is not None:
            self.watch.stop()
        parts: list[bytes] = []
        try:
            async for chunk in self._tee:
                parts.append(chunk)
        finally:
            await self._end()
        return b"".join(parts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watch = self.watch if self.watch is not None else ClientWatch(receive)
        stall = SendStall(watch, self.send_idle_seconds)
        try:
            await send(
                {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
            )
            first = True
            async for chunk in self._tee:
                stall.sending = True
                if len(chunk) <= MAX_FRAME_BYTES:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                else:
                    for at in range(0, len(chunk), MAX_FRAME_BYTES):
                        piece = chunk[at : at + MAX_FRAME_BYTES]
                        await send({"type": "http.response.body", "body": piece, "more_body": True})
                        stall.sends += 1
                stall.sending = False
                stall.sends += 1
                if first:  # the first token goes out before the stream's next work (its progress)
                    first = False
                    hand_over_now()
            stall.sending = True
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not watch.cancelled_for_client():
                raise
        except OSError:
            pass  # the connection broke under a write: the client is gone
        finally:
            # Stopped before the hooks: the request's close (its charge) must never be cancelled.
            stall.stop()
            watch.stop()
            await self._end()

    async def _end(self) -> None:
        # Closed now, not whenever the collector finds them: a body cut off mid-way runs its
        # clean-up at once. The hooks run once, however the body was read.
        await self._tee.aclose()
        await self._content.aclose()
        hooks, self._on_end = self._on_end, []
        for hook in hooks:
            done = hook()
            if done is not None:
                await done


# The most of a stream handed to the server in one message. Granian lets four messages wait for a
# client that does not read before a write waits too: four in count, not in bytes, and one chunk of
# a stream can be a whole upstream read (a megabyte, more once translated), so a client that stopped
# reading would leave megabytes in the worker, counted as delivered (review).
MAX_FRAME_BYTES: Final = 64 * 1024
# How long one write of a stream may wait for its client before the client is given up ([limits]
# send_idle_timeout_seconds, nginx's send_timeout). Not nginx's 60 s: a write waits until the
# kernel's send buffer (megabytes) has drained by half, so a client that reads steadily but slowly
# sees writes wait for minutes (review: 16 KB/s was cut at 20 s); at 300 s, one that reads under
# about 5 KB/s of a stream faster than that.
SEND_IDLE_SECONDS: Final = 300.0


class SendStall:
    """Gives a stream's client up (ClientWatch.give_up) when one write has waited for it to read
    through two looks `seconds` apart (so for `seconds` to twice that): a client that holds its
    connection open and reads nothing would otherwise hold the request, its upstream connection and
    its buffers for ever. One timer a stream, looked at every `seconds`; the stream counts its
    writes (`sends`) and says when one waits (`sending`)."""

    __slots__ = ("_handle", "_seconds", "_seen", "_watch", "sending", "sends")

    def __init__(self, watch: ClientWatch, seconds: float) -> None:
        self._watch = watch
        self._seconds = seconds
        self.sending = False
        self.sends = 0
        self._seen = -1
        self._handle: asyncio.TimerHandle | None = asyncio.get_running_loop().call_later(seconds, self._look)

    def _look(self) -> None:
        # `_seen` is the count of writes at the last look if one was waiting then, else -1.
        if self.sending and self.sends == self._seen:
            self._handle = None
            log.warning("a stream's client read nothing for %.0f s: given up", self._seconds)
            self._watch.give_up()
            return
        self._seen = self.sends if self.sending else -1
        self._handle = asyncio.get_running_loop().call_later(self._seconds, self._look)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


ModelHandler = Callable[[Request, Call], Awaitable[Response]]
Endpoint = Callable[[Request], Awaitable[Response]]
REQUEST_ID_HEADER = "x-service-request-id"
# The id /v1/usage/{id} takes, for an answer whose body cannot carry it (audio, plain text, a 503
# whose charge is queued).
RESPONSE_ID_HEADER = "x-service-response-id"
COST_HEADER = "x-service-cost"  # a plain answer's cost, in US dollars (spec 4)
# The mark model_endpoint leaves on what it returns (gateway.model_dispatch serves those first).
_MODEL_ENDPOINT = "_gateway_model_endpoint"
log = logging.getLogger("gateway.requests")


def resolve_model(state: GatewayState, call: Call, name: Any, model_type: str) -> ModelConfig:
    """The model a request names for this endpoint (ModelRegistry.resolve), noted on the call at
    once, so that a request refused while its body is checked is logged with its model too."""
    try:
        model = state.registry.resolve(name, call.ctx, model_type)
    except ModelRefused as refused:
        call.model = refused.model  # an operator looking for the model's refusals finds this one
        raise
    call.model = model.name
    return model


def model_endpoint(state: GatewayState, handler: ModelHandler, *, idempotent: bool = False) -> Endpoint:
    """Authenticate (401s carry no request id, spec 7.3), then give the call its request id, which
    every answer from here on carries, errors included. The handler runs while the client is
    there: one that leaves is noticed at once and the request cancelled (`_watched`). When the
    request ends, billing closes it: its charge and its log entry become durable as one step
    (gateway.billing.close), before the answer goes out. `idempotent` endpoints honour the
    Idempotency-Key header (gateway.idempotency); an answer is kept only after its charge is
    durable, so a replayed answer was always paid for."""

    async def endpoint(request: Request) -> Response:
        started_ns = instant_ns()
        try:
            ctx = await authenticate(request, state.store)
        except GatewayError as err:
            # A key refused (401) has no request id (spec 7.3.1); a key that could not be checked
            # (the store away: 503) is not a refusal for the key, and its answer carries one.
            log_id = None
            if err.status != 401:
                log_id = err.headers[REQUEST_ID_HEADER] = request_id()
            request_log.record_refusal(
                state, request, started_ns, err.status, err.body(request.url.path), err.code, log_id
            )
            raise
        call = Call(ctx, request_id(), started_ns)  # positional: keywords cost a dataclass ~0.14 us
        scope = request.scope
        scope[MODEL_REQUEST] = True  # it reports itself at its close (gateway.telemetry)
        call.endpoint = endpoint_of(scope)
        call.trace = trace(scope)
        replayed_code: str | None = None  # an Idempotency-Key's replayed error, for its log entry
        try:
            call.rate = await state.limiter.admit(ctx, request.scope)
            note_rate(request.scope, call.rate)  # for the answer's x-ratelimit-* headers
            key = idempotency.requested_key(request) if idempotent else None
            body = await read_body(
                request,
                state.settings.max_request_bytes,
                state.settings.body_idle_timeout_seconds,
                started_ns,
                state.settings.sync_timeout_seconds,
                state.drain,
            )
            replay = None if key is None else await idempotency.claim(state, request, call, key, body)
            if replay is not None:
                replay.headers[REQUEST_ID_HEADER] = call.request_id
                replayed_code = idempotency.replayed_error_code(replay)
                response: Response = replay
            else:
                response = await _watched(request, call, handler)
                if call.idempotency is not None and isinstance(response, HeldStream):
                    # Kept whole before it is answered. An upstream that breaks off meanwhile is
                    # the model's failure (502), before anything reached the client.
                    headers = dict(response.headers)
                    try:
                        whole = await response.collect()
                    except UPSTREAM_FAILURES:
                        raise GatewayError(
                            "provider_error", "The model's provider broke off its answer before it was whole."
                        ) from None
                    response = Response(whole, response.status_code, headers)
        except GatewayError as failed:
            if isinstance(failed, ServiceUnavailable) and call.settlement is not None:
                # The model ran and its charge stands (made, or queued, at the close below): the
                # 503 must not say nothing was charged (review: a response whose state could not
                # be kept on a full disk). The store's own error stays its context. Rebound, not
                # kept in another name: the except clause deletes this one, and a local holding
                # the exception would make a reference cycle of the frame (test_model_dispatch).
                failed = _charge_queued(failed, call, call.settlement.id)
            failed.headers[REQUEST_ID_HEADER] = call.request_id
            kept = idempotency.kept_error(call, failed) if call.idempotency is not None else None
            try:
                if await _close(
                    state,
                    request,
                    call,
                    failed.status,
                    failed.body(request.url.path),
                    error_code=failed.code,
                    answer=kept,
                ):
                    idempotency.taken(call)
                elif call.idempotency is not None:
                    await idempotency.keep_error(state, call, failed)
            except ServiceUnavailable as away:
                # The store away as this error is answered (review: the store's own 503, without
                # the request's id, replaced it): what is queued commits later, and a claim it
                # could not let go of lapses with its lease.
                log.warning("request %s: its close waits for the %s", call.request_id, away.service)
            raise failed
        except ClientGone:
            if call.client_gone:
                await _close(state, request, call, request_log.CLIENT_CLOSED, None)
                await idempotency.forget(state, call)
                return Response(status_code=request_log.CLIENT_CLOSED)  # nobody is there to read it
            # The body ended early: the client left, or (the server says the same of both) sent a
            # malformed chunked body and waits for an answer, which it gets in the spec's format,
            # and which its log entry shows (spec 7.5.3), not a 499 the client never saw.
            cut = body_cut()
            cut.headers[REQUEST_ID_HEADER] = call.request_id
            await _close(state, request, call, cut.status, cut.body(request.url.path), error_code=cut.code)
            await idempotency.forget(state, call)
            return error_response(cut, path=request.url.path)
        except Exception as exc:
            # Logged with its traceback for operators; the client gets the spec's 500 with the
            # request's id, as every answer after the key is checked carries it (spec 7.3).
            log.error("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
            failure = unexpected_failure()
            failure.headers[REQUEST_ID_HEADER] = call.request_id
            try:
                await _close(
                    state, request, call, 500, failure.body(request.url.path), error_code=failure.code
                )
                await idempotency.forget(state, call)
            except Exception:  # the store failing too: the client still gets its 500 with its id
                log.exception("request %s: closing it after an unexpected error failed", call.request_id)
            raise failure from None
        except BaseException:  # cancelled: the server is stopping
            await _close(state, request, call, request_log.CLIENT_CLOSED, None)
            raise
        if isinstance(response, HeldStream):  # a stream closes when it ends
            stream = response
            stream.send_idle_seconds = state.settings.send_idle_timeout_seconds
            if stream.summary is None:
                stream.capture = request_log.BodyCapture(state.settings.log_max_body_bytes)

            async def close_stream() -> None:
                kept = stream.summary() if stream.summary is not None else None
                if kept is None and stream.capture is not None:
                    kept = stream.capture.body()
                # A stream the client did not read to its end: it left (as nginx logs it), unless
                # the stream itself failed (its error code set): then its status and that code.
                ended = stream.finished or call.error_code is not None
                status = stream.status_code if ended else request_log.CLIENT_CLOSED
                try:
                    await _close(state, request, call, status, kept, stream.sent, call.error_code)
                except ServiceUnavailable:
                    # The stream has gone out; its settlement stays queued and is made once the
                    # store is back (docs/behaviour.md, "Faults"): nothing more to tell anyone.
                    log.warning("the settlement of stream %s waits for the store", call.request_id)

            stream.when_done(close_stream)
        else:
            body = bytes(response.body)

            def answer() -> tuple[GatewayState, Call, int, dict[str, str], bytes]:
                # What an Idempotency-Key keeps: made only for a request that has one.
                return state, call, response.status_code, dict(response.headers), body

            # Kept with the charge, in one step: a process killed between the two would leave a
            # charge whose key a retry could run, and be charged for, again.
            kept = idempotency.kept_response(call, response) if call.idempotency is not None else None
            usage_id = call.settlement.id if call.settlement is not None else None
            try:
                if await _close(
                    state, request, call, response.status_code, body, error_code=replayed_code, answer=kept
                ):
                    idempotency.taken(call)
            except ServiceUnavailable as err:
                # The charge could not be made durable in time (the store is away): it stays queued
                # and is made when the store is back, so the answer must not say nothing was charged,
                # and a retry with its Idempotency-Key must replay it, not run and charge again.
                if call.idempotency is not None:
                    idempotency.keep_when_possible(*answer())
                raise _charge_queued(err, call, usage_id) from None
            if call.idempotency is not None:
                held = call.idempotency
                try:
                    await idempotency.keep(*answer())
                except ServiceUnavailable:  # charged and answered: the answer is kept later
                    call.idempotency = held
                    idempotency.keep_when_possible(*answer())
        return response

    setattr(endpoint, _MODEL_ENDPOINT, True)
    return endpoint


def is_model_endpoint(endpoint: object) -> bool:
    """Whether `endpoint` is one model_endpoint made."""
    return getattr(endpoint, _MODEL_ENDPOINT, False) is True


def _charge_queued(err: ServiceUnavailable, call: Call, usage_id: str | None) -> GatewayError:
    """The 503 of a request that ran and was charged, whose charge waits for the store: it names
    the id its usage record will have (the answer that would have carried it is not sent; review:
    the message pointed at the request id, which /v1/usage does not take) and, as the answer would
    have (spec 4: a plain answer carries its cost), the cost it is charged."""
    where = "" if usage_id is None else f" under the id {usage_id} (header {RESPONSE_ID_HEADER})"
    queued = GatewayError(
        "service_unavailable",
        f"The gateway cannot reach its {err.service} at the moment. This request ran and its charge"
        f" is queued: it is charged once, when the service is back, and its usage record appears{where}.",
        headers=dict(err.headers),
    )
    queued.headers[REQUEST_ID_HEADER] = call.request_id
    if usage_id is not None:
        queued.headers[RESPONSE_ID_HEADER] = usage_id
    if call.charged is not None:
        queued.headers[COST_HEADER] = format_cost(call.charged)
    return queued


class ClientGone(Exception):
    """The client left before the answer: the request was cancelled (or, while its body was being
    read, never really began)."""


def body_cut() -> GatewayError:
    """The answer to a body that ended before it was whole (read_body's ClientGone): the client
    left, or sent a malformed chunked body and waits for an answer, which is then a 400."""
    return invalid_request(
        "The request's body ended before it was whole (or its chunked encoding is malformed)."
    )


async def _watched(request: Request, call: Call, handler: ModelHandler) -> Response:
    """Run the handler under a ClientWatch: a client that leaves cancels the request at once. A
    streamed answer takes the watch over, to the stream's end (HeldStream)."""
    watch = ClientWatch(request.receive, lambda: call.cancel_on_disconnect)
    try:
        response = await handler(request, call)
    except asyncio.CancelledError:
        watch.stop()
        if watch.cancelled_for_client():
            call.client_gone = True
            raise ClientGone from None
        raise
    except BaseException:
        watch.stop()
        raise
    if isinstance(response, HeldStream):
        response.watch = watch
    else:
        watch.stop()
    return response


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _close(
    state: GatewayState,
    request: Request,
    call: Call,
    status: int,
    body: bytes | None,
    size: int | None = None,
    error_code: str | None = None,
    answer: KeptAnswer | None = None,
) -> bool:
    return await billing.close(
        state, call, request_log.entry_for(state, request, call, status, body, size, error_code), answer
    )


# How long a request's body may stop arriving, where no setting says ([limits]
# body_idle_timeout_seconds, which the model endpoints pass).
BODY_IDLE_SECONDS = 60.0


async def read_body(
    request: Request,
    limit: int,
    idle_seconds: float = BODY_IDLE_SECONDS,
    started_ns: int = 0,
    window_seconds: float = 0.0,
    drain: Drain | None = None,
) -> bytes:
    """The whole body, refused with 413 as soon as it passes `limit` bytes (never buffered whole),
    and with 408 timeout when nothing of it arrives for `idle_seconds` (a client declaring more
    than it sends would otherwise hold the request, and its connection, open for ever). The model
    endpoints also pass the request's start (clock.instant_ns) and the synchronous window, which runs
    from it (spec 8: "from start of request to last byte"): a body still arriving as it closes is
    504 timeout (one that trickles in would hold them open as long); and the worker's `drain`, at
    whose deadline a request still receiving its body is answered 503 service_unavailable rather
    than killed with its worker. Read once: a second call returns the same bytes."""
    kept: bytes | None = request.scope.get(request_log.BODY_SCOPE_KEY)
    if kept is not None:
        return kept
    declared = _declared_length(request.scope)
    if declared > limit:
        raise request_too_large(limit)
    # The server's messages read straight (Starlette's Request.stream() is an async generator
    # around the same loop, a few microseconds a request more).
    parts: list[bytes] = []
    size = 0
    receive = request.receive
    # The first message waits its idle time (a body sent with its head is there at once, and the
    # request has only begun), ended early only by the drain's deadline; the later ones of a body
    # in pieces are bounded by the window too (_later_piece). A window shorter than the idle time
    # bounds them all.
    later = 0.0 < window_seconds < idle_seconds
    while True:
        try:
            if later:
                message = await _later_piece(receive, idle_seconds, started_ns, window_seconds, drain)
            elif drain is None:
                with within(idle_seconds):
                    message = await receive()
            else:
                with within(idle_seconds) as block:
                    drain.waits.add(block)
                    try:
                        message = await receive()
                    finally:
                        drain.waits.discard(block)
        except TimeoutError:
            request_log.note_received(request, size)
            raise _body_late(drain is not None and drain.cut, False, idle_seconds) from None
        except GatewayError:
            request_log.note_received(request, size)
            raise
        if message["type"] != "http.request":  # the client left before its body was whole
            request_log.note_received(request, size)
            raise ClientGone
        chunk: bytes = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                request_log.note_received(request, size)
                raise request_too_large(limit)
            parts.append(chunk)
        # A body as long as its content-length is whole (the server frames requests by it):
        # Granian still sends an empty closing message, whose hand-over across threads need not
        # delay the request; the ClientWatch, next to receive, takes it and waits on.
        if not message.get("more_body", False) or size == declared:
            break
        later = window_seconds > 0.0 or drain is not None
    body = parts[0] if len(parts) == 1 else b"".join(parts)
    request_log.keep_request_body(request, body)
    return body


async def _later_piece(
    receive: Receive, idle_seconds: float, started_ns: int, window_seconds: float, drain: Drain | None
) -> Message:
    """The next message of a body in pieces, within its idle time, what is left of the window, and
    the drain's deadline once a drain began; a wait begun before the drain did is ended at its
    deadline too. Its end is the spec's error (_body_late)."""
    wait = idle_seconds
    if window_seconds:
        left = window_seconds - (instant_ns() - started_ns) / 1e9
        wait = left if left < wait else wait  # not min(): several times the instructions
    by_drain = False  # the drain's deadline is the nearest bound (its timer may fire before the drain's)
    if drain is not None and drain.cut_at is not None:
        left = drain.seconds_left()
        if left <= wait:
            wait, by_drain = left, True
    try:
        if wait <= 0:
            raise TimeoutError
        with within(wait) as block:
            if drain is None:
                return await receive()
            drain.waits.add(block)
            try:
                return await receive()
            finally:
                drain.waits.discard(block)
    except TimeoutError:
        drained = by_drain or (drain is not None and drain.cut)
        raise _body_late(drained, wait < idle_seconds, idle_seconds) from None


def _body_late(drained: bool, windowed: bool, idle_seconds: float) -> GatewayError:
    """Why a body's wait ended: the drain's deadline, the synchronous window, or its idle time."""
    if drained:
        return GatewayError(
            "service_unavailable",
            "The gateway is shutting down and the request's body had not all arrived. Retry.",
            headers={"Retry-After": "1"},
        )
    if windowed:
        return GatewayError(
            "timeout",
            "The request ran past the synchronous time window while its body was arriving.",
            status=504,
            headers={"connection": "close"},  # spec 8: the connection closed; its body is unread
        )
    return GatewayError(
        "timeout",
        f"The request's body stopped arriving for {idle_seconds:g} seconds.",
        status=408,
        headers={"connection": "close"},  # its body is unread: the connection cannot carry another
    )


def _declared_length(scope: Scope) -> int:
    """The request's Content-Length (the first one, as Starlette's Headers reads it), -1 without a
    valid one; read from the scope's header list, without making a Headers object for it."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.isdigit() else -1
    return -1


def public_base(state: GatewayState, request: Request) -> str:
    """Where clients reach the gateway, for the URLs it hands out (images, videos, kept in
    idempotent answers and logs): `[server] public_base_url`; else the request's own scheme and
    Host when that host is in `[server] allowed_hosts`; else the address it listens on. Never an
    unchecked Host header, which any client can set."""
    settings = state.settings
    if settings.public_base_url:
        return settings.public_base_url
    host = request.headers.get("host", "").lower()
    name = host[: host.rindex(":")] if host.rfind(":") > host.rfind("]") else host  # without a port
    if host and (host in settings.allowed_hosts or name in settings.allowed_hosts):
        return f"{request.url.scheme}://{host}"
    listen = "127.0.0.1" if settings.host in ("", "0.0.0.0", "::") else settings.host
    return f"http://{f'[{listen}]' if ':' in listen else listen}:{settings.port}"


async def owned_job(state: GatewayState, request: Request, kind: str, param: str, what: str) -> Job:
    """The job of this kind that the path parameter `param` names, if the calling key made it;
    another key's, or none, is 404 "No {what} ..."."""
    ctx = await authenticate(request, state.store)
    job_id = request.path_params[param]
    job = await state.store.get_job(job_id, ctx.key.id, kind)
    if job is None:
        raise GatewayError("not_found", f"No {what} {quoted_id(job_id)}.")
    return job


# How deeply a request body may nest arrays and objects. What reads a body after the parse (the Rust
# core's serde, 128 levels; orjson's encoder, 255, after a translation adds its few) must never be
# the first to find it too deep: that would be the gateway's failure, a 500, for a client's bytes.
MAX_JSON_DEPTH: Final = 100


def parse_object(raw: bytes) -> dict[str, Any]:
    if json_nesting_depth(raw, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        raise invalid_request(
            f"The request body nests arrays and objects deeper than {MAX_JSON_DEPTH} levels."
        )
    try:
        payload = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise invalid_request(f"The request body is not valid JSON: {exc}.") from exc
    if not isinstance(payload, dict):
        raise invalid_request("The request body must be a JSON object.")
    return payload


class JsonAnswer(Response):
    """A model's JSON answer (200), its head made as Starlette's Response makes it (`headers`, then
    content-length and content-type) without the general case's work: Starlette's own costs ~20,000
    instructions with two headers (benches/instructions.py), on every plain model request. Header
    names are lowered and values written as Latin-1, as Starlette writes them; `headers` must not
    hold content-length or content-type."""

    media_type = "application/json"

    def __init__(self, body: bytes, headers: Mapping[str, str]) -> None:
        self.status_code = 200
        self.background = None
        self.body = body
        raw = [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()]
        raw.append((b"content-length", b"%d" % len(body)))
        raw.append((b"content-type", b"application/json"))
        self.raw_headers = raw


def json_response(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(payload), status_code=status, headers=headers, media_type="application/json")


def list_query(request: Request, known: tuple[str, ...]) -> Mapping[str, str]:
    """A list request's query, refused (400) if it has a parameter the list does not read: a
    misspelt filter (`account=`) would otherwise list everyone's entries, a misspelt cursor page 1
    again and again. Each parameter once."""
    query = request.query_params
    for name in query:
        if name not in known:
            raise invalid_request(
                f"Unknown query parameter `{name}` (this list takes {', '.join(known)}).", name
            )
        if len(query.getlist(name)) > 1:
            raise invalid_request(f"The query parameter `{name}` is given more than once.", name)
    return query

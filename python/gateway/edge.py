"""The application's outermost middleware: what every HTTP answer gets on its way out, in one layer
(each ASGI layer costs every request a call and a wrapped `send`):

- the key's x-ratelimit-* headers (gateway.ratelimit_headers), errors and unexpected 500s included;
- `connection: close` once the worker has notice of its shutdown (gateway.drain), so that a client
  learns from the answer that its connection ends;
- the request's report to telemetry, for every request that is not a model request (those report
  at their close, with their usage: gateway.telemetry).
"""

from __future__ import annotations

from collections.abc import Awaitable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .clock import instant_ns
from .drain import Drain
from .ratelimit_headers import RateLimitHeaders
from .ratelimits import SCOPE_KEY, KeySlot
from .runtime_threads import hand_over_now
from .telemetry import ERROR_CODE, MODEL_REQUEST, Telemetry

_CLOSE = (b"connection", b"close")


class AnswerEdge:
    def __init__(
        self, app: ASGIApp, rate_headers: RateLimitHeaders, drain: Drain, telemetry: Telemetry
    ) -> None:
        self._app = app
        self._rate_headers = rate_headers
        self._drain = drain
        self._telemetry = telemetry
        self._under_way = 0  # HTTP requests of this process not yet answered to their end

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        started_ns = instant_ns()
        slot = scope[SCOPE_KEY] = KeySlot(started_ns)
        status = 0

        def send_answer(message: Message) -> Awaitable[None]:
            # A plain function that hands on the server's own awaitable: an answer's messages pass
            # here without a coroutine of their own, unless its head gets headers (_with_headers).
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                if self._drain.closing or not RateLimitHeaders.none_for(slot):
                    return self._with_headers(scope, slot, message, send)
                return send(message)
            sent = send(message)
            if self._under_way == 1 and not message.get("more_body", False):
                # The only request under way: nothing else needs the core, so the answer's end
                # goes out before the request's clean-up (gateway.runtime_threads).
                hand_over_now()
            return sent

        self._under_way += 1
        try:
            await self._app(scope, receive, send_answer)
        except BaseException:
            status = status or 500
            raise
        finally:
            self._under_way -= 1
            if not scope.get(MODEL_REQUEST):
                # No answer started and nothing raised: the client left first (logged as nginx does).
                self._telemetry.answered(scope, status or 499, scope.get(ERROR_CODE), started_ns)

    async def _with_headers(self, scope: Scope, slot: KeySlot, message: Message, send: Send) -> None:
        """The answer's head with the key's x-ratelimit-* headers and, once the worker is told to
        stop, `connection: close`."""
        closing = self._drain.closing
        headers = list(message.get("headers", ()))
        changed = await self._rate_headers.add(scope, slot, headers)
        if closing:
            headers.append(_CLOSE)
        if changed or closing:
            message = {**message, "headers": headers}
        await send(message)

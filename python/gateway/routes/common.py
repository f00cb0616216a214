"""What every route shares: the model-endpoint wrapper, body reading and JSON parsing."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from .. import billing
from ..auth import authenticate
from ..billing import Call
from ..errors import GatewayError, invalid_request
from ..ids import request_id
from ..state import GatewayState


class HeldStream(StreamingResponse):
    """A streamed answer that closes its request's hold however it ends: its body settles what was
    streamed, and whatever the body left open (a client gone before the body began) is released."""

    def __init__(
        self, content: AsyncGenerator[bytes, None], on_end: Callable[[], None], **kwargs: Any
    ) -> None:
        super().__init__(content, **kwargs)
        self._content = content
        self._on_end = on_end

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            # A body cut off mid-way (client disconnect) runs its own clean-up (settlement) now,
            # not whenever the collector finds it.
            await self._content.aclose()
            self._on_end()


ModelHandler = Callable[[Request, Call], Awaitable[Response]]
Endpoint = Callable[[Request], Awaitable[Response]]
REQUEST_ID_HEADER = "x-service-request-id"


def model_endpoint(state: GatewayState, handler: ModelHandler) -> Endpoint:
    """Authenticate (401s carry no request id, spec 7.3), then give the call its request id, which
    every answer from here on carries, errors included."""

    async def endpoint(request: Request) -> Response:
        ctx = await authenticate(request, state.store)
        call = Call(ctx=ctx, request_id=request_id(), started_ns=time.time_ns())
        try:
            response = await handler(request, call)
        except GatewayError as err:
            billing.release(state, call)
            err.headers[REQUEST_ID_HEADER] = call.request_id
            raise
        except BaseException:
            billing.release(state, call)
            raise
        if not isinstance(response, HeldStream):  # a stream closes its hold when it ends
            billing.release(state, call)
        return response

    return endpoint


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, refused with 413 as soon as it passes `limit` bytes (never buffered whole)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    parts: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        parts.append(chunk)
    return b"".join(parts)


def _too_large(limit: int) -> GatewayError:
    return GatewayError(
        "request_too_large", f"The request is larger than the gateway's limit of {limit} bytes."
    )


def parse_object(raw: bytes) -> dict[str, Any]:
    try:
        payload = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise invalid_request(f"The request body is not valid JSON: {exc}.") from exc
    if not isinstance(payload, dict):
        raise invalid_request("The request body must be a JSON object.")
    return payload


def json_response(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(payload), status_code=status, headers=headers, media_type="application/json")

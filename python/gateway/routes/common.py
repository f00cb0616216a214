"""What every route shares: the model-endpoint wrapper, body reading and JSON parsing."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from ..auth import authenticate
from ..billing import Call
from ..errors import GatewayError, invalid_request
from ..ids import request_id
from ..state import GatewayState

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
            return await handler(request, call)
        except GatewayError as err:
            err.headers[REQUEST_ID_HEADER] = call.request_id
            raise

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

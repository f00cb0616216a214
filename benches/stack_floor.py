"""The stack floor: the gateway's own serving stack with none of its features. Granian's ASGI
interface on uvloop, as `gateway serve` runs it, and the gateway's own upstream client
(gateway.providers.http), forwarding the request body to the upstream and its answer (plain or
streamed) back: no auth, no limits, no holds, no billing, no logs, no telemetry, no Starlette.

Beside the pass-through anchor (benches/passthrough.py: RSGI and aiohttp), it splits the gateway's
distance from that anchor into what the stack costs and what the features cost: the gateway's CPU
per request minus this path's is the price of every feature together.

    STACK_FLOOR_UPSTREAM=http://127.0.0.1:PORT/v1 \\
        granian --interface asgi --loop uvloop --workers 1 --port N --app-dir benches stack_floor:app
"""

from __future__ import annotations

import os
from typing import Any

from gateway.config import Settings
from gateway.providers.http import UpstreamClient

UPSTREAM = os.environ.get("STACK_FLOOR_UPSTREAM", "http://127.0.0.1:8081/v1")
READ_TIMEOUT_SECONDS = 60.0
_client = UpstreamClient(Settings(models=()))


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await _client.start()
                await send({"type": "lifespan.startup.complete"})
            else:
                await _client.close()
                await send({"type": "lifespan.shutdown.complete"})
                return
    parts = []
    while True:
        message = await receive()
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    path = scope["path"].removeprefix("/v1")
    headers = {"content-type": "application/json"}
    upstream = await _client.post(UPSTREAM + path, b"".join(parts), headers, READ_TIMEOUT_SECONDS)
    try:
        content_type = upstream.headers.get("content-type", "application/json")
        answer = [(b"content-type", content_type.encode())]
        await send({"type": "http.response.start", "status": upstream.status, "headers": answer})
        if content_type.startswith("text/event-stream"):
            async for chunk in upstream.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        else:
            await send({"type": "http.response.body", "body": await upstream.read()})
    finally:
        upstream.release()

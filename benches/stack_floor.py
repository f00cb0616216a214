"""The stack floor: the gateway's own serving stack with none of its features. Granian's ASGI
interface on uvloop, as `gateway serve` runs it, and the gateway's own upstream client
(gateway.providers.http), forwarding the request body to the upstream and its answer (plain or
streamed) back: no auth, no limits, no holds, no billing, no logs, no telemetry, no Starlette.

Beside the pass-through anchor (benches/passthrough.py: RSGI and aiohttp), it splits the gateway's
distance from that anchor into what the stack costs and what the features cost: the gateway's CPU
per request minus this path's is the price of every feature together.

With STACK_FLOOR_HOLD_HEAD=1 it holds a stream's head and first chunks back until the first chunk
with content, then sends them, as spec 6.1.7 asks of a gateway (an error before the first token
must be an ordinary JSON error): the anchor for the first token, whose cost that rule adds to any
gateway's (the client reads the head and the token together, not the head while the model thinks).

    STACK_FLOOR_UPSTREAM=http://127.0.0.1:PORT/v1 \\
        granian --interface asgi --loop uvloop --http 1 --workers 1 --port N --app-dir benches stack_floor:app
"""

from __future__ import annotations

import os
from typing import Any

from load import has_content  # benches/load.py: the client's own test of a first token

from gateway.config import Settings
from gateway.providers.http import UpstreamClient

UPSTREAM = os.environ.get("STACK_FLOOR_UPSTREAM", "http://127.0.0.1:8081/v1")
READ_TIMEOUT_SECONDS = 60.0
HOLD_HEAD = os.environ.get("STACK_FLOOR_HOLD_HEAD") == "1"
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
        start = {
            "type": "http.response.start",
            "status": upstream.status,
            "headers": [(b"content-type", content_type.encode())],
        }
        if not content_type.startswith("text/event-stream"):
            await send(start)
            await send({"type": "http.response.body", "body": await upstream.read()})
            return
        held: list[bytes] | None = [] if HOLD_HEAD else None
        if held is None:
            await send(start)
        async for chunk in upstream.iter_any():
            out = chunk
            if held is not None:
                held.append(chunk)
                out = b"".join(held)
                if not has_content(out):
                    continue
                await send(start)
                held = None
            await send({"type": "http.response.body", "body": out, "more_body": True})
        if held is not None:  # the stream ended without content
            await send(start)
            await send({"type": "http.response.body", "body": b"".join(held), "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    finally:
        upstream.release()

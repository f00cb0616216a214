"""The bare pass-through anchor: Granian RSGI and one pooled aiohttp session, forwarding the request
body to the upstream and its answer (plain or streamed) back, with no feature at all: no auth, no
limits, no billing, no logs. What a gateway on this stack could cost at the very least.

    PASSTHROUGH_UPSTREAM=http://127.0.0.1:PORT/v1 \\
        granian --interface rsgi --http 1 --workers 1 --port N --app-dir benches passthrough:app
"""

from __future__ import annotations

import os
from typing import Any

import aiohttp

UPSTREAM = os.environ.get("PASSTHROUGH_UPSTREAM", "http://127.0.0.1:8081/v1")
_sessions: list[aiohttp.ClientSession] = []  # the worker's one session, made in its own loop


async def app(scope: Any, proto: Any) -> None:
    if not _sessions:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None)
        _sessions.append(aiohttp.ClientSession(connector=connector, auto_decompress=False))
    body = await proto()
    path = scope.path.removeprefix("/v1")
    headers = {"content-type": scope.headers.get("content-type", "application/json")}
    async with _sessions[0].post(UPSTREAM + path, data=body, headers=headers) as upstream:
        answer = [("content-type", upstream.headers.get("content-type", "application/json"))]
        if upstream.headers.get("content-type", "").startswith("text/event-stream"):
            transport = proto.response_stream(upstream.status, answer)
            async for chunk in upstream.content.iter_any():
                await transport.send_bytes(chunk)
        else:
            proto.response_bytes(upstream.status, answer, await upstream.read())

"""The simulator's own routes: the log of requests it received, its health, the image files its
links name, and the model list."""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson
from aiohttp import web

from . import images
from .wire import reply, respond

if TYPE_CHECKING:
    from .state import Simulator

MODELS = orjson.dumps(
    {"object": "list", "data": [{"id": "sim", "object": "model", "created": 0, "owned_by": "sim"}]}
)


async def requests(sim: Simulator, request: web.Request) -> web.StreamResponse:
    """GET /_sim/requests: what arrived, oldest first."""
    return reply(200, orjson.dumps(list(sim.requests)))


async def forget(sim: Simulator, request: web.Request) -> web.StreamResponse:
    """DELETE /_sim/requests."""
    sim.requests.clear()
    return reply(200, b"{}")


async def health(sim: Simulator, request: web.Request) -> web.StreamResponse:
    return reply(200, b'{"ok":true}')


async def image_file(sim: Simulator, request: web.Request) -> web.StreamResponse:
    return respond(images.file(request.match_info["name"]))


async def models(sim: Simulator, request: web.Request) -> web.StreamResponse:
    return reply(200, MODELS)

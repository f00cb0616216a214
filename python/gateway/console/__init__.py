"""The console (docs/console.md): a web UI for account members and the operator, served by the
gateway itself at /console/ (and / sends browsers there). Server-rendered pages (Jinja2) with a
little JavaScript of their own and a vendored chart library; no build step. Every figure comes from
the store through the same operations as the management API (gateway.management)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import Message, Receive, Scope, Send

from ..state import GatewayState
from . import balance, compare, keys, logs, operator, overview, playground, signin
from .endpoints import Console
from .render import STATIC_DIR, with_security_headers


def routes(state: GatewayState) -> list[BaseRoute]:
    console = Console(state)

    async def to_console(request: Request) -> Response:
        return with_security_headers(RedirectResponse("/console/", status_code=307))

    pages: list[BaseRoute] = [
        *signin.routes(console),
        *overview.routes(console),
        *logs.routes(console),
        *keys.routes(console),
        *balance.routes(console),
        *playground.routes(console),
        *compare.routes(console),
        *operator.routes(console),
        Mount("/static", app=_Static(StaticFiles(directory=STATIC_DIR)), name="static"),
    ]

    async def no_icon(request: Request) -> Response:
        # Browsers ask every site for one: an empty answer, not a 404 in every page's console.
        return Response(status_code=204, headers={"cache-control": "public, max-age=86400"})

    return [
        Route("/", to_console, methods=["GET", "HEAD"]),
        Route("/console", to_console, methods=["GET", "HEAD"]),
        Route("/favicon.ico", no_icon, methods=["GET", "HEAD"]),
        Mount("/console", routes=pages),
    ]


class _Static:
    """The console's scripts, styles and the vendored chart library, with its security headers."""

    def __init__(self, app: StaticFiles) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                names = {k.lower() for k, _ in headers}
                for name, value in (
                    (b"x-content-type-options", b"nosniff"),
                    (b"cache-control", b"public, max-age=300"),
                ):
                    if name not in names:
                        headers.append((name, value))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)

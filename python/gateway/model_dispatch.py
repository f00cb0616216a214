"""The model endpoints answered straight from the edge, ahead of Starlette's stack.

A model request is the gateway's hot path. Through Starlette it would pass the server-error and
exception middleware, the router's walk over every route's pattern and the route's own exception
wrapper, each a call and (for two of them) a wrapped `send` per message: about a tenth of a model
request's CPU (measured in benches/README.md). Here a `POST` to a model endpoint's exact path is a
dictionary lookup, its endpoint runs as Starlette would run it (same Request, same scope keys, the
same exception handlers deciding the answer), and everything else (other methods, paths with
parameters, a trailing slash, a mounted root path) goes through Starlette unchanged.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from .routes.common import is_model_endpoint

ErrorAnswer = Callable[[Request, Exception], Awaitable[Response]]


class ModelDispatch:
    def __init__(self, app: ASGIApp, routes: Iterable[BaseRoute], answer_error: ErrorAnswer) -> None:
        """`app` is Starlette's stack, for everything not dispatched here; `answer_error` turns
        what an endpoint raised into its answer, as the app's exception handlers do."""
        self._app = app
        self._answer_error = answer_error
        self._routes = {
            route.path: route
            for route in routes
            if isinstance(route, Route)
            and route.methods == {"POST"}
            and not route.param_convertors
            and is_model_endpoint(route.endpoint)
        }

    @property
    def paths(self) -> set[str]:
        """The paths served here (their POSTs)."""
        return set(self._routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = (
            self._routes.get(scope["path"])
            if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path")
            else None
        )
        if route is None:
            await self._app(scope, receive, send)
            return
        # What Starlette's router puts in the scope for a matched route (telemetry reads "route").
        scope["route"] = route
        scope["endpoint"] = route.endpoint
        scope["path_params"] = {}
        request = Request(scope, receive, send)
        try:
            response = await route.endpoint(request)
        except Exception as exc:
            response = await self._answer_error(request, exc)
        await response(scope, receive, send)

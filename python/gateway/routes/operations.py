"""For the people who run the gateway: GET /health (the process answers), GET /ready (it can serve:
store reachable and migrated, Redis reachable where configured; else 503 with the reasons) and
GET /metrics (Prometheus text; its own bearer token or the admin token, see docs/operations.md).
None of them takes an API key or shows anything secret."""

from __future__ import annotations

import asyncio
import hmac
import os
import re

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ..auth import bearer_token
from ..errors import GatewayError
from ..state import GatewayState
from ..telemetry import metrics

# How long /ready waits for Redis's answer.
READY_REDIS_SECONDS = 1.0


def routes(state: GatewayState) -> list[BaseRoute]:
    async def health(request: Request) -> Response:
        body = {"status": "draining" if state.drain.closing else "ok"}
        return Response(orjson.dumps(body), media_type="application/json")

    async def ready(request: Request) -> Response:
        problems = await not_ready(state)
        if problems:
            return Response(
                orjson.dumps({"status": "unavailable", "reasons": [without_addresses(p) for p in problems]}),
                status_code=503,
                media_type="application/json",
                headers={"retry-after": "5"},
            )
        return Response(orjson.dumps({"status": "ready"}), media_type="application/json")

    async def metrics_text(request: Request) -> Response:
        settings = state.settings
        tokens = [
            os.environ.get(name, "")
            for name in (settings.metrics_token_env, settings.admin_token_env)
            if name is not None
        ]
        tokens = [t for t in tokens if t]
        if not settings.metrics_enabled or not tokens:
            # Served without a token on a public port would show the traffic to anyone: off here
            # unless a token is set ([metrics] listen serves it on an address of its own).
            raise GatewayError("not_found", "No such path: /metrics.")
        given = bearer_token(request)
        if given is None or not any(hmac.compare_digest(given.encode(), t.encode()) for t in tokens):
            raise GatewayError(
                "invalid_admin_token",
                "GET /metrics needs the metrics token (or the admin token) as a bearer token.",
            )
        body = await asyncio.to_thread(metrics.render)  # reads every process's files
        return Response(body, media_type=metrics.CONTENT_TYPE)

    return [
        Route("/health", health, methods=["GET"]),
        Route("/ready", ready, methods=["GET"]),
        Route("/metrics", metrics_text, methods=["GET"]),
    ]


# Where a service lives, as errors name it: a URL, a host and port, asyncpg's ('host', port), or a
# socket's or file's absolute path (not the "/" inside a word, as in "I/O").
_ADDRESS = re.compile(
    r"[a-zA-Z][a-zA-Z0-9+.-]*://\S+|\(\s*'[^']*',\s*\d+\s*\)|\[?[\w.:-]*[\w\]]:\d{1,5}\b"
    r"|(?<![\w./])/[^\s:'\")]+"
)


def without_addresses(reason: str) -> str:
    """A reason for the unauthenticated /ready: the services' addresses left out (operator review:
    it named Redis's host and port; docs/operations.md says neither probe shows one)."""
    return _ADDRESS.sub("<address>", reason)


async def not_ready(state: GatewayState) -> list[str]:
    """Why the gateway cannot serve now (empty: it can)."""
    problems = []
    if state.drain.closing:
        problems.append("the gateway is shutting down")
    try:
        store = await state.store.ready()
    except Exception as exc:  # a store must answer, not raise; never the probe's 500
        store = f"the store failed to answer: {type(exc).__name__}"
    if store is not None:
        problems.append(store)
    redis = state.redis
    if redis is not None:
        # Only here: a gateway without Redis never loads its modules.
        from ..redis_client import UNAVAILABLE

        try:
            async with asyncio.timeout(READY_REDIS_SECONDS):
                await redis.ping()
        except (*UNAVAILABLE, TimeoutError) as exc:
            problems.append(f"Redis is out of reach: {type(exc).__name__}: {exc}")
    return problems

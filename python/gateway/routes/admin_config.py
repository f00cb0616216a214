"""POST /admin/v1/config/reload: the configuration file again, without a restart (admin token).

The file is checked here first: a bad one is refused with 400 invalid_request naming each problem,
and nothing changes. A good one is handed to the supervisor (SIGHUP to the worker's parent,
gateway.supervisor), which checks it once more and replaces the workers one by one, each new one
listening before the old one drains: the answer (202) comes before the reload is done. A gateway
not run by `gateway serve` (no supervisor above the worker) answers 503 service_unavailable."""

from __future__ import annotations

import asyncio
import os
import signal

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .. import installed
from ..auth import admin_token, authenticate_admin
from ..config import CONFIG_ENV, check_and_load
from ..errors import GatewayError
from ..reload import accepted_settings, command_line_flags, fixed_changes
from ..state import GatewayState
from .admin import admin_body, no_fields
from .common import json_response

SUPERVISOR_MODULE = "gateway.supervisor"


def routes(state: GatewayState) -> list[Route]:
    token = admin_token(state.settings)

    async def reload(request: Request) -> Response:
        authenticate_admin(request, token)
        # It takes no field: one given is refused as every admin endpoint refuses an unknown one
        # (operator review: {"x": 1} was taken), a body that is not a JSON object too.
        no_fields(await admin_body(request, state.settings))
        if await asyncio.to_thread(installed.changed_since_start):  # as the supervisor would refuse it
            raise GatewayError("invalid_request", f"Nothing was reloaded: {installed.UPGRADED}.")
        path = os.environ.get(CONFIG_ENV, "")
        checked = await asyncio.to_thread(check_and_load, path)
        problems = list(checked.problems)
        if checked.settings is not None:
            running = await asyncio.to_thread(accepted_settings, state.settings)
            problems = fixed_changes(running, checked.settings, command_line_flags())
        if problems:
            raise GatewayError(
                "invalid_request",
                "The configuration file is not valid; nothing was reloaded: " + "; ".join(problems),
            )
        supervisor = os.getppid()
        if not _is_supervisor(supervisor):
            raise GatewayError(
                "service_unavailable",
                "This gateway was not started by `gateway serve`: there is no supervisor to reload it.",
            )
        os.kill(supervisor, signal.SIGHUP)
        answer = {"status": "reloading", "config": os.path.basename(path), "warnings": list(checked.warnings)}
        return json_response(answer, 202)

    return [Route("/admin/v1/config/reload", reload, methods=["POST"])]


def _is_supervisor(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return SUPERVISOR_MODULE.encode() in f.read()
    except OSError:
        return False

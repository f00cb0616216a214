"""GET /v1/usage/{request_id} (Shape D, spec 2.3): the usage record of one of this key's requests."""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..auth import authenticate
from ..clock import rfc3339
from ..errors import GatewayError
from ..pricing import cost_number
from ..state import GatewayState
from .common import json_response

# Seconds between the lookups of a usage record not found (yet): 0.3 s in all, several times the
# embedded store's group-commit linger and a PostgreSQL commit.
SETTLING_PAUSES = (0.01, 0.02, 0.04, 0.08, 0.15)


def routes(state: GatewayState) -> list[Route]:
    async def get_usage(request: Request) -> Response:
        ctx = await authenticate(request, state.store)
        usage_id = request.path_params["request_id"]
        record = await state.store.get_usage(usage_id, ctx.key.id)
        for pause in SETTLING_PAUSES:
            if record is not None:
                break
            # Asked for right after its request ended, a record may still be on its way to the store
            # (settlements are applied in batches; another worker or instance may hold it): a miss
            # is looked up again for a moment before it is answered 404.
            await asyncio.sleep(pause)
            record = await state.store.get_usage(usage_id, ctx.key.id)
        if record is None:
            # Another key's record looks exactly like one that does not exist (yet).
            raise GatewayError(
                "not_found",
                f"No usage record {usage_id!r} for this key (yet). A request's record comes once it has"
                " ended; one that failed, and a job that failed or was cancelled before it used"
                " anything, was not charged and has none.",
            )
        return json_response(
            {
                "id": record.id,
                "model": record.model,
                # A JSON number in plain notation, the same digits as x-service-cost.
                "cost": cost_number(record.cost),
                "status": record.status,
                "usage": {
                    "prompt_tokens": record.prompt_tokens,
                    "completion_tokens": record.completion_tokens,
                    "total_tokens": record.total_tokens,
                },
                "started_at": rfc3339(record.started_at_ms),
                "ended_at": rfc3339(record.ended_at_ms),
                "duration_ms": record.duration_ms,
            }
        )

    return [Route("/v1/usage/{request_id}", get_usage, methods=["GET"])]

"""Background upkeep of one gateway process: deleting what has expired (served images, response
states). Runs as a task of the app's lifespan; each worker runs one, and a delete that finds nothing
costs one index lookup."""

from __future__ import annotations

import asyncio
import logging

from .clock import now_ms
from .state import GatewayState

# Expired rows are deleted at least this often (more often when image URLs live shorter).
PURGE_INTERVAL_SECONDS = 60.0
log = logging.getLogger("gateway.housekeeping")


async def purge_expired(state: GatewayState) -> None:
    interval = min(PURGE_INTERVAL_SECONDS, state.settings.image_url_ttl_seconds)
    purges = {"images": state.store.purge_images, "response states": state.store.purge_responses}
    while True:
        await asyncio.sleep(interval)
        now = now_ms()
        for what, purge in purges.items():
            try:
                await purge(now)
            except Exception:  # retried at the next tick; the task must not die
                log.exception("purging expired %s failed", what)

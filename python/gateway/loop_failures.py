"""Failures nothing waits for: what a background loop (job polling, lease tending, purges, gauges)
says when a pass fails, and the outcome of a future nobody awaits any more (`outcome_taken`).

A service that is away (the store's database, its disk: ServiceUnavailable) fails every pass until
it is back, and the store says so itself once an episode: such a loop says it once too, as a
warning, and once more when a pass succeeds again. Anything else is a fault worth its traceback,
every time. Before, each loop logged the outage's traceback every second (outage review: 1,270
ERROR entries in 80 s from two instances, a real traceback buried among them)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from .errors import ServiceUnavailable


def outcome_taken(done: asyncio.Future[Any]) -> None:
    """A done callback that takes the outcome of a future nobody may await any more (a write whose
    waiter timed out, a connection attempt whose callers left, a query given up on), so that its
    failure is not logged as never retrieved."""
    if not done.cancelled():
        done.exception()


class QuietWhileAway:
    def __init__(self, log: logging.Logger, what: str) -> None:
        self._log = log
        self._what = what
        self._away = False

    def failed(self, exc: Exception) -> None:
        if isinstance(exc, ServiceUnavailable):
            if not self._away:
                self._away = True
                self._log.warning("%s waits: %s (said once until it is back)", self._what, exc)
            return
        self._log.error("%s failed", self._what, exc_info=exc)

    def succeeded(self) -> None:
        if self._away:
            self._away = False
            self._log.info("%s resumed", self._what)

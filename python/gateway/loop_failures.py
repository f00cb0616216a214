"""What a background loop (job polling, lease tending, purges, gauges) says when a pass fails.

A service that is away (the store's database, its disk: ServiceUnavailable) fails every pass until
it is back, and the store says so itself once an episode: such a loop says it once too, as a
warning, and once more when a pass succeeds again. Anything else is a fault worth its traceback,
every time. Before, each loop logged the outage's traceback every second (outage review: 1,270
ERROR entries in 80 s from two instances, a real traceback buried among them)."""

from __future__ import annotations

import logging

from .errors import ServiceUnavailable


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

"""Request log bodies waiting for a store's writer, bounded: when the writer falls behind (the
machine is saturated, the database is away), new entries are kept without their bodies rather than
let memory grow without bound. One per writer, whatever the backend."""

from __future__ import annotations

import logging
import threading
from dataclasses import replace

from .records import RequestLog

log = logging.getLogger("gateway.store")

# Bodies waiting beyond this are not kept (their entries are).
MAX_LOG_BACKLOG_BYTES = 4 * 1024 * 1024


def body_bytes(entry: RequestLog) -> int:
    return len(entry.request_body or b"") + len(entry.response_body or b"")


class LogBodyBacklog:
    """Admit an entry's bodies on queueing it, release them once written (or dropped). Safe from
    any thread: the SQLite writer releases from its own."""

    def __init__(self) -> None:
        self._bytes = 0
        self._lock = threading.Lock()
        self._dropped = 0

    def admit(self, entry: RequestLog) -> tuple[RequestLog, int]:
        """The entry, without its bodies when they would pass the bound, and the bytes it now holds
        in the backlog (to release later)."""
        bodies = body_bytes(entry)
        if bodies and self._bytes + bodies > MAX_LOG_BACKLOG_BYTES:
            entry = replace(entry, request_body=None, response_body=None)
            bodies = 0
            self._dropped += 1
            if self._dropped in (1, 1000) or self._dropped % 100_000 == 0:
                log.warning("request log writes are behind: %d entries kept without bodies", self._dropped)
        if bodies:
            with self._lock:
                self._bytes += bodies
        return entry, bodies

    @property
    def waiting_bytes(self) -> int:
        """The bodies admitted and not yet released."""
        return self._bytes

    def release(self, count: int) -> None:
        if count:
            with self._lock:
                self._bytes -= count

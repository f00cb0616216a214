"""Wall-clock time as the gateway stores and shows it: integer milliseconds since the epoch, and
RFC 3339 UTC text with milliseconds."""

from __future__ import annotations

import time
from datetime import UTC, datetime


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def rfc3339(ms: int) -> str:
    """e.g. 2026-11-22T10:04:05.123Z, as usage records and the management API show times."""
    moment = datetime.fromtimestamp(ms // 1000, tz=UTC).replace(microsecond=(ms % 1000) * 1000)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"

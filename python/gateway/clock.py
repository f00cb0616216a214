"""Wall-clock time as the gateway stores and shows it: integer milliseconds since the epoch, and
RFC 3339 UTC text with milliseconds."""

from __future__ import annotations

import time
from datetime import UTC, datetime


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# A request's instants (its start, its first byte) are read on the monotonic clock, which a step
# of the wall clock (an NTP correction, an operator's `date -s`) does not move: its windows and
# durations stay what they were (time review: a step back of 10 s mid-request logged a duration
# of -7,997 ms and an end before the start). Its records' wall times are made from them here.
instant_ns = time.monotonic_ns


def span_ms(started_ns: int) -> tuple[int, int]:
    """(started_at_ms, ended_at_ms) on the wall clock of what began at the monotonic instant
    `started_ns` and ends now: the end is now, the start that less the time elapsed."""
    ended_ns = time.time_ns()
    return (ended_ns - (time.monotonic_ns() - started_ns)) // 1_000_000, ended_ns // 1_000_000


def wall_ns(instant: int) -> int:
    """The wall-clock time (ns since the epoch) of a monotonic instant, by the clocks' offset now."""
    return instant + time.time_ns() - time.monotonic_ns()


def rfc3339(ms: int) -> str:
    """e.g. 2026-11-22T10:04:05.123Z, as usage records and the management API show times."""
    moment = datetime.fromtimestamp(ms // 1000, tz=UTC).replace(microsecond=(ms % 1000) * 1000)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"

"""A key's own credit limit (spec 2.4, 5.4): what it has spent in its current period.

Periods follow UTC calendar boundaries: a daily limit resets at midnight, a weekly one on Monday at
midnight (ISO weeks), a monthly one at midnight on the first of the month; a limit without a reset
counts everything the key ever spent. The store keeps, per key, the amount spent and the start of
the period it belongs to; a settlement in a later period starts the count again.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the store itself uses period_start_ms
    from .store import ApiKey

FOREVER = 0  # the one "period" of a limit that never resets


def period_start_ms(reset: str | None, at_ms: int) -> int:
    """The start (ms since the epoch, UTC) of the period that contains `at_ms`."""
    if reset is None:
        return FOREVER
    day = datetime.fromtimestamp(at_ms // 1000, tz=UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if reset == "weekly":
        day -= timedelta(days=day.weekday())
    elif reset == "monthly":
        day = day.replace(day=1)
    elif reset != "daily":
        raise ValueError(f"unknown limit reset {reset!r}")
    return int(day.timestamp()) * 1000


def spent_now(key: ApiKey, now_ms: int) -> Decimal:
    """What the key has spent in the period containing `now_ms` (0 once a new period began)."""
    if key.spent_period_ms == period_start_ms(key.limit_reset, now_ms):
        return key.spent
    return Decimal(0)

"""A key's own credit limit (spec 2.4, 5.4): what it has spent in its current period.

Periods follow UTC calendar boundaries: a daily limit resets at midnight, a weekly one on Monday at
midnight (ISO weeks), a monthly one at midnight on the first of the month; a limit without a reset
counts everything the key ever spent. The store keeps, per key, the amount spent and the start of
the period it belongs to; a settlement in a later period starts the count again, one of an earlier
period counts in the key's own.
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


# A key's period never goes back (time review): with instances whose clocks differ by a moment,
# or a clock stepped back, `now` or a request's end can fall before the period the key is already
# in. Read as "a new period began", that lifted the limit (the key spent 0) and left the charge
# out of every count: across each period's start a key could spend its limit once more. So a key's
# period later than now's is its current one, and a charge of an earlier period counts in it
# (store/postgres/migrations/0014 holds the database's side to the same rule).


def spent_at(reset: str | None, spent: Decimal, period_ms: int, now_ms: int) -> Decimal:
    """What a key whose count is `spent` in the period starting `period_ms` has spent in its
    current period at `now_ms`: 0 once a new period began."""
    return spent if period_ms >= period_start_ms(reset, now_ms) else Decimal(0)


def spent_now(key: ApiKey, now_ms: int) -> Decimal:
    return spent_at(key.limit_reset, key.spent, key.spent_period_ms, now_ms)


def counted(
    reset: str | None, spent: Decimal, period_ms: int, cost: Decimal, ended_at_ms: int
) -> tuple[Decimal, int]:
    """A key's count and its period after a charge of `cost` for a request that ended at
    `ended_at_ms`: in the period it ended in, or in the key's own when that is later."""
    period = period_start_ms(reset, ended_at_ms)
    if period <= period_ms:
        return spent + cost, period_ms
    return cost, period

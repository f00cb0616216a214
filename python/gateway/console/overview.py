"""An account's overview (docs/console.md): its balance, what it spent today and this month (UTC),
and charts of its requests, errors and spend over 24 hours, 7 days or 30 days.

Every figure comes from the store's request log statistics (RequestLogs.log_stats: one indexed
query per period), the same entries the Logs page lists. The charts read /api/stats, which sends
money as exact decimal strings; the script turns them into numbers only to draw them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from .. import admin_fields as field
from ..clock import now_ms
from ..errors import invalid_request
from ..store import LogStats
from .endpoints import Console
from .render import page
from .security import Viewer

HOUR_MS: Final = 3_600_000
DAY_MS: Final = 24 * HOUR_MS


@dataclass(frozen=True, slots=True)
class Range:
    """A period the overview shows: `buckets` bars of `bucket_ms`, the last one the current."""

    name: str
    label: str
    bucket_ms: int
    buckets: int

    def bounds(self, now: int) -> tuple[int, int]:
        """[since, until): whole buckets (UTC hours or days), the current one included."""
        until = now - now % self.bucket_ms + self.bucket_ms
        return until - self.buckets * self.bucket_ms, until


RANGES: Final = {
    r.name: r
    for r in (
        Range("24h", "24 hours", HOUR_MS, 24),
        Range("7d", "7 days", DAY_MS, 7),
        Range("30d", "30 days", DAY_MS, 30),
    )
}
DEFAULT_RANGE: Final = "7d"


def range_of(request: Request) -> Range:
    name = request.query_params.get("range", DEFAULT_RANGE)
    if name not in RANGES:
        raise invalid_request(f"`range` must be one of {', '.join(RANGES)}.", "range")
    return RANGES[name]


def stats_json(chosen: Range, since_ms: int, until_ms: int, stats: LogStats) -> dict[str, Any]:
    """A period's statistics for the charts: money as decimal strings, times as Unix ms (UTC)."""
    cost = sum((b.cost for b in stats.buckets), Decimal(0))
    return {
        "object": "log_stats",
        "range": chosen.name,
        "bucket_ms": chosen.bucket_ms,
        "since_ms": since_ms,
        "until_ms": until_ms,
        "buckets": [
            {
                "start_ms": b.start_ms,
                "requests": b.requests,
                "errors": b.errors,
                "cost": field.money_text(b.cost),
            }
            for b in stats.buckets
        ],
        "by_model": [
            {"model": model, "requests": requests, "cost": field.money_text(spent)}
            for model, requests, spent in stats.by_model
        ],
        "totals": {
            "requests": sum(b.requests for b in stats.buckets),
            "errors": sum(b.errors for b in stats.buckets),
            "cost": field.money_text(cost),
        },
    }


def month_start_ms(now: int) -> int:
    moment = datetime.fromtimestamp(now / 1000, tz=UTC)
    return int(moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0).timestamp() * 1000)


def routes(console: Console) -> list[BaseRoute]:
    store = console.state.store

    async def period(account_id: str, chosen: Range) -> dict[str, Any]:
        since, until = chosen.bounds(now_ms())
        return stats_json(
            chosen, since, until, await store.log_stats(account_id, since, until, chosen.bucket_ms)
        )

    async def overview(request: Request, viewer: Viewer) -> Response:
        account = await console.account_of(request, viewer)
        chosen = range_of(request)
        now = now_ms()
        # This month by UTC day, in one query: today is its last day.
        month_since = month_start_ms(now)
        today_since = now - now % DAY_MS
        month = await store.log_stats(account.id, month_since, today_since + DAY_MS, DAY_MS)
        spent_month = sum((b.cost for b in month.buckets), Decimal(0))
        spent_today = sum((b.cost for b in month.buckets if b.start_ms >= today_since), Decimal(0))
        stats = await period(account.id, chosen)
        return page(
            request,
            "overview.html",
            viewer,
            account=account,
            spent_today=spent_today,
            spent_month=spent_month,
            ranges=list(RANGES.values()),
            chosen=chosen,
            stats=stats,
        )

    async def stats_api(request: Request, viewer: Viewer) -> Response:
        account = await console.account_of(request, viewer)
        return JSONResponse(await period(account.id, range_of(request)))

    return [
        Route("/a/{account_id}/", console.page(overview), methods=["GET"]),
        Route("/a/{account_id}/api/stats", console.api(stats_api), methods=["GET"]),
    ]

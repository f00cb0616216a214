"""An account's balance and its top-up ledger, newest first (docs/console.md). Money is added by
the operator (the operator view, /admin/v1, `gateway admin top-up`), never here."""

from __future__ import annotations

from decimal import Decimal
from typing import Final

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from .endpoints import Console
from .logs import small_int
from .render import page
from .security import Viewer

PAGE_SIZE: Final = 50


def routes(console: Console) -> list[BaseRoute]:
    store = console.state.store

    async def balance(request: Request, viewer: Viewer) -> Response:
        account = await console.account_of(request, viewer)
        # The store pages the ledger oldest first; an account's top-ups are few (each one is an
        # operator's act), so the whole ledger is read and shown newest first, a page at a time.
        ledger = list(reversed(await store.list_top_ups(account.id)))
        number = request.query_params.get("page", "1")
        current = small_int(number) or 1  # not a page number (or 0): the first page
        pages = max(1, -(-len(ledger) // PAGE_SIZE))
        current = min(current, pages)
        shown = ledger[(current - 1) * PAGE_SIZE : current * PAGE_SIZE]
        return page(
            request,
            "balance.html",
            viewer,
            account=account,
            top_ups=shown,
            topped_up=sum((t.amount for t in ledger), Decimal(0)),
            count=len(ledger),
            current=current,
            pages=pages,
        )

    return [Route("/a/{account_id}/balance", console.page(balance), methods=["GET"])]

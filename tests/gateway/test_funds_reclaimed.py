"""A process reclaimed as dead while it was alive (it stalled past the liveness bound): the store
took its leases back, so its holds must lease afresh instead of spending money it no longer has."""

from __future__ import annotations

import asyncio
from decimal import Decimal

from test_store_contract import account_and_key
from test_store_postgres import play_dead, stores

from gateway.clock import now_ms
from gateway.funds import Funds, NotCovered
from gateway.store import KeyContext


def test_a_process_reclaimed_while_alive_leases_afresh(postgres_url: str) -> None:
    async def main() -> None:
        async with stores(postgres_url, 2) as (stalled, other):
            account_id, key_id = await account_and_key(other, "10")
            account = await other.get_account(account_id)
            key = await other.get_key(key_id)
            assert account is not None and key is not None
            ctx = KeyContext(key=key, account=account)
            funds = Funds(stalled)
            held = await funds.hold(ctx, Decimal(1))  # its lease: the whole balance (alone)
            funds.release(held, Decimal(0))
            # It stalls: its heartbeat stops, another process reclaims it, and leases the money.
            await play_dead(postgres_url, stalled)
            assert await other.reclaim_orphans() == 0
            now = now_ms()
            assert await other.lease("account", account_id, Decimal(8), 1, now) == Decimal(10)
            # Back to life: it learns it was reclaimed (its next heartbeat or lease) ...
            await stalled._heartbeat()
            assert stalled.lease_epoch == 1
            # ... and its next hold finds nothing free, instead of the 10 it believed it had.
            try:
                await funds.hold(ctx, Decimal(1))
            except NotCovered:
                pass
            else:
                raise AssertionError("held money another process had leased")
            await other.return_lease("account", account_id, Decimal(10))
            again = await funds.hold(ctx, Decimal(1))  # leases afresh once money is free
            funds.release(again, Decimal(0))

    asyncio.run(main())

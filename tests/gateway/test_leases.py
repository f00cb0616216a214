"""Leases in the embedded store (gateway.funds): processes sharing one database never lease more
than a pot holds; a charge comes off the lease it was held on; a dead process's leases go back."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from decimal import Decimal
from pathlib import Path

from gateway.auth import display_prefix, generate_key, hash_key
from gateway.funds import Funds
from gateway.store import UsageRecord
from gateway.store.sqlite import SqliteStore

NOW = 1_795_000_000_000


def leases(db: Path) -> dict[str, Decimal]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT owner, amount FROM leases WHERE kind = 'account'").fetchall()
    return {owner: Decimal(amount) for owner, amount in rows}


def test_two_processes_share_one_balance(tmp_path: Path) -> None:
    db = tmp_path / "l.db"

    async def go() -> None:
        a, b = SqliteStore(db), SqliteStore(db)
        await a.start()
        await b.start()
        account = await a.create_account("acct", Decimal(10))
        acct = account.id
        # Each grants what is needed plus half of the rest (two workers).
        assert await a.lease("account", acct, Decimal(1), 2, NOW) == Decimal("5.5")
        assert await b.lease("account", acct, Decimal(1), 2, NOW) == Decimal("2.75")
        assert await a.lease("account", acct, Decimal(5), 2, NOW) == 0  # only 1.75 is free
        assert await b.lease("account", acct, Decimal("1.75"), 2, NOW) == Decimal("1.75")
        assert sum(leases(db).values()) == 10

        # A charge of 2 held on a's lease: the balance and a's lease both lose it.
        await a.settle(UsageRecord("u1", "r", "key_x", acct, "m", "completed", 1, 1, Decimal(2), NOW, NOW))
        await a.purge_responses(0)  # queued behind the settlement in a's writer
        assert leases(db) == {a.lease_owner: Decimal("3.5"), b.lease_owner: Decimal("4.5")}
        assert (await a.get_account(acct)).balance == 8  # type: ignore[union-attr]

        # b returns part of its lease; a can then lease it.
        await b.return_lease("account", acct, Decimal("0.5"))
        assert await a.lease("account", acct, Decimal("0.5"), 2, NOW) == Decimal("0.5")

        # a dies (its journal lock goes with it, its file stays): b reclaims a's leases.
        assert a._journal is not None
        os.close(a._journal._fd)
        a._journal = None
        await b.reclaim_orphans()
        assert leases(db) == {b.lease_owner: Decimal(4)}
        assert await b.lease("account", acct, Decimal(4), 2, NOW) == Decimal(4)
        await b.close()
        assert leases(db) == {}  # a clean stop returns every lease

    asyncio.run(go())


def test_a_key_limit_is_a_pot_of_its_own(tmp_path: Path) -> None:
    db = tmp_path / "k.db"

    async def go() -> None:
        store = SqliteStore(db)
        await store.start()
        try:
            account = await store.create_account("acct", Decimal(100))
            secret = generate_key()
            key = await store.create_key(
                account.id,
                "k",
                hash_key(secret),
                display_prefix(secret),
                None,
                credit_limit=Decimal(3),
                limit_reset="daily",
            )
            assert await store.lease("key", key.id, Decimal(1), 1, NOW) == 3  # the whole limit
            assert await store.lease("key", key.id, Decimal("0.01"), 1, NOW) == 0
            # A key without a limit (any more) grants what is asked: only the balance counts.
            await store.update_key(key.id, {"credit_limit": None})
            assert await store.lease("key", key.id, Decimal(7), 1, NOW) == 7
        finally:
            await store.close()

    asyncio.run(go())


def test_a_refill_cancelled_midway_gives_its_grant_back(tmp_path: Path) -> None:
    """A request whose client leaves while its refill is in the store's queue: the grant, committed
    anyway, goes back, so the balance is not locked away until the process ends."""
    db = tmp_path / "c.db"

    async def go() -> tuple[dict[str, Decimal], Decimal]:
        store = SqliteStore(db)
        await store.start()
        funds = Funds(store)
        try:
            account = await store.create_account("acct", Decimal(10))
            secret = generate_key()
            await store.create_key(account.id, "k", hash_key(secret), display_prefix(secret), None)
            ctx = await store.find_key(hash_key(secret))
            assert ctx is not None
            waiting = asyncio.create_task(funds.hold(ctx, Decimal(1)))
            await asyncio.sleep(0)  # the refill is queued in the writer
            waiting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiting
            for _ in range(100):  # the grant lands, then goes back
                await asyncio.sleep(0.01)
                if not leases(db):
                    break
            after = leases(db)
            held = await funds.hold(ctx, Decimal(10))  # the whole balance is there to lease again
            return after, held.amount
        finally:
            await store.close()

    after, amount = asyncio.run(go())
    assert after == {} and amount == 10


def test_a_key_change_invalidates_caches_even_when_its_caller_is_cancelled(tmp_path: Path) -> None:
    async def go() -> tuple[bool, bool]:
        store = SqliteStore(tmp_path / "g.db")
        await store.start()
        try:
            account = await store.create_account("acct", Decimal(10))
            secret = generate_key()
            key = await store.create_key(account.id, "k", hash_key(secret), display_prefix(secret), None)
            assert await store.find_key(hash_key(secret)) is not None  # cached now
            deleting = asyncio.create_task(store.delete_key(key.id))
            await asyncio.sleep(0)
            deleting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await deleting
            await store.purge_responses(0)  # a write queued behind the delete: it has committed
            await asyncio.sleep(0.01)
            return deleting.cancelled(), await store.find_key(hash_key(secret)) is None
        finally:
            await store.close()

    assert asyncio.run(go()) == (True, True)

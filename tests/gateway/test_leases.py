"""Leases in the store (gateway.funds), on both backends: processes sharing one database never lease
more than a pot holds; a charge comes off the lease it was held on; a dead process's leases go back."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest

from gateway.auth import display_prefix, generate_key, hash_key
from gateway.config import Settings
from gateway.funds import RECALL_WAIT_SECONDS, Funds, NotCovered
from gateway.store import Store, UsageRecord, open_store
from gateway.store.leasing import SPARE_MIN_HOLDS, grant
from gateway.store.sqlite import SqliteStore
from harness import funded_key, query, store_spec

NOW = 1_795_000_000_000


@pytest.fixture
def settings(tmp_path: Path, backend: str) -> Iterator[Settings]:
    """Settings that open a new store on each backend (tests/conftest.py)."""
    with store_spec(tmp_path, backend) as spec:
        yield spec.settings()


def leases(settings: Settings) -> dict[str, Decimal]:
    rows = query(settings, "SELECT owner, amount FROM leases WHERE kind = 'account'")
    return {owner: amount for owner, amount in rows}


async def die(store: Store) -> None:
    """The process behind `store` dies, as the other processes see it. SQLite: its journal's lock
    goes with it (the file stays). PostgreSQL: its heartbeat stops, and the last one is older than
    OWNER_TIMEOUT_SECONDS (set back in the database rather than waited for)."""
    if isinstance(store, SqliteStore):
        assert store._journal is not None
        store._journal._file.close()
        store._journal = None
        return
    from gateway.store.postgres import OWNER_TIMEOUT_SECONDS, PostgresStore

    assert isinstance(store, PostgresStore) and store._control_task is not None
    store._control_task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await store._control_task
    store._control_task = None
    async with store._acquire() as conn:
        await conn.execute(
            "UPDATE owners SET heartbeat_at = now() - make_interval(secs => $1) WHERE id = $2",
            OWNER_TIMEOUT_SECONDS + 1,
            store.lease_owner,
        )


def test_two_processes_share_one_balance(settings: Settings) -> None:
    async def go() -> None:
        a, b = open_store(settings), open_store(settings)
        await a.start()
        await b.start()
        account = await a.create_account("acct", Decimal(10))
        acct = account.id
        # Plentiful: each grants what is needed plus half of the rest (two workers).
        assert await a.lease("account", acct, Decimal("0.1"), 2, NOW) == Decimal("5.05")
        assert await b.lease("account", acct, Decimal("0.1"), 2, NOW) == Decimal("2.525")
        assert await a.lease("account", acct, Decimal(5), 2, NOW) == 0  # only 2.425 is free
        # Scarce (the spare would cover fewer than 16 more holds): exactly what is needed.
        assert await b.lease("account", acct, Decimal("0.4"), 2, NOW) == Decimal("0.4")
        assert await b.lease("account", acct, Decimal("2.025"), 2, NOW) == Decimal("2.025")
        assert sum(leases(settings).values()) == 10

        # A charge of 2 held on a's lease: the balance and a's lease both lose it.
        await a.settle(UsageRecord("u1", "r", "key_x", acct, "m", "completed", 1, 1, Decimal(2), NOW, NOW))
        # Committed once a's writer has taken a write queued behind it (SQLite) and a read of a's
        # sees it (PostgreSQL: settle returns at the hand-over, before the commit); only then is
        # the lease table read on a connection of its own.
        await a.purge_responses(0)
        assert (await a.get_account(acct)).balance == 8  # type: ignore[union-attr]
        assert leases(settings) == {a.lease_owner: Decimal("3.05"), b.lease_owner: Decimal("4.95")}

        # b returns part of its lease; a can then lease it.
        await b.return_lease("account", acct, Decimal("0.5"))
        assert await a.lease("account", acct, Decimal("0.5"), 2, NOW) == Decimal("0.5")

        # a dies: b reclaims a's leases.
        await die(a)
        await b.reclaim_orphans()
        assert leases(settings) == {b.lease_owner: Decimal("4.45")}
        assert await b.lease("account", acct, Decimal("3.55"), 2, NOW) == Decimal("3.55")
        await b.close()
        assert leases(settings) == {}  # a clean stop returns every lease
        await a.close()  # what is left of the dead process (its connections)

    asyncio.run(go())


def test_a_key_limit_is_a_pot_of_its_own(settings: Settings) -> None:
    async def go() -> None:
        store = open_store(settings)
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


def test_a_refill_cancelled_midway_gives_its_grant_back(settings: Settings) -> None:
    """A request whose client leaves while its refill is in the store's queue: the grant, committed
    anyway, goes back, so the balance is not locked away until the process ends."""

    async def go() -> tuple[dict[str, Decimal], Decimal]:
        store = open_store(settings)
        await store.start()
        funds = Funds(store)
        try:
            ctx, _ = await funded_key(store, Decimal(10))
            waiting = asyncio.create_task(funds.hold(ctx, Decimal(1)))
            await asyncio.sleep(0)  # the refill is queued in the writer
            waiting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiting
            for _ in range(100):  # the grant lands, then goes back
                await asyncio.sleep(0.01)
                if not leases(settings):
                    break
            after = leases(settings)
            held = await funds.hold(ctx, Decimal(10))  # the whole balance is there to lease again
            return after, held.amount
        finally:
            await store.close()

    after, amount = asyncio.run(go())
    assert after == {} and amount == 10


def test_a_lease_that_runs_short_recalls_what_other_processes_do_not_hold(settings: Settings) -> None:
    """Money one process leased while the pot was plentiful and does not use is no reason to refuse
    another's request: the refused refill recalls the pot, the first process gives back what none
    of its holds uses (at its next housekeeping pass), and the request goes ahead. When what comes
    back does not cover it, it is refused as soon as every process has answered, and the pot's next
    refusals in that process come at once."""

    async def go() -> None:
        a, b = open_store(settings), open_store(settings)
        await a.start()
        await b.start()
        funds_a, funds_b = Funds(a), Funds(b)
        answering = True

        async def housekeeping() -> None:  # gateway.housekeeping.tend_leases, faster
            while answering:
                await funds_a.answer_recalls()
                await asyncio.sleep(0.1)

        try:
            ctx_a, key_hash = await funded_key(a, Decimal(100))
            ctx_b = await b.find_key(key_hash)
            assert ctx_b is not None
            # a leases 1 and half of the rest while the pot is plentiful, then holds nothing.
            funds_a.release(await funds_a.hold(ctx_a, Decimal(1)), Decimal(0))
            assert leases(settings) == {a.lease_owner: Decimal("50.5")}
            held = [await funds_b.hold(ctx_b, Decimal(49))]  # scarce for so much: exactly 49
            assert leases(settings)[b.lease_owner] == 49
            keeper = asyncio.create_task(housekeeping())
            # Only 0.5 is free: b's next dollar comes from a's unused lease, once a answers.
            held.append(await funds_b.hold(ctx_b, Decimal(1)))
            assert leases(settings) == {b.lease_owner: Decimal(75)}  # 49 + 1 + half of the rest
            # a now holds all that is free: nothing unheld comes back from it.
            held_a = await funds_a.hold(ctx_a, Decimal(25))
            started = time.monotonic()
            with pytest.raises(NotCovered) as refused:
                await funds_b.hold(ctx_b, Decimal(26))
            assert time.monotonic() - started < RECALL_WAIT_SECONDS  # as soon as a had answered
            assert refused.value.available == 25  # b's own lease, unheld
            recalls = 0
            recall = b.recall

            async def counted_recall(kind: str, pot_id: str) -> Decimal:
                nonlocal recalls
                recalls += 1
                return await recall(kind, pot_id)

            b.recall = counted_recall  # type: ignore[method-assign]
            with pytest.raises(NotCovered):
                await funds_b.hold(ctx_b, Decimal(26))
            assert recalls == 0  # no second recall (nor wait) on a pot just found spent
            assert not await b.recall_pending("account", ctx_a.account.id)
            answering = False
            await keeper
            funds_a.release(held_a, Decimal(0))
            for hold in held:
                funds_b.release(hold, Decimal(0))
        finally:
            await b.close()
            await a.close()

    asyncio.run(go())


def test_an_answer_between_two_reads_of_a_recall_is_not_missed(settings: Settings) -> None:
    """The other process answers the recall just after the waiting request read what is free (still
    too little): the request must still see what came back, not take "no recall pending" read after
    the answer for "nothing is coming". (CI once refused a request here with the money back.)"""

    async def go() -> None:
        a, b = open_store(settings), open_store(settings)
        await a.start()
        await b.start()
        funds_a, funds_b = Funds(a), Funds(b)
        read_free = b.free

        async def free_then_answered(kind: str, pot_id: str, now_ms: int) -> Decimal | None:
            found = await read_free(kind, pot_id, now_ms)
            if await a.recalls():  # a answers between this read and the next one
                await funds_a.answer_recalls()
            return found

        try:
            ctx_a, key_hash = await funded_key(a, Decimal(100))
            ctx_b = await b.find_key(key_hash)
            assert ctx_b is not None
            funds_a.release(await funds_a.hold(ctx_a, Decimal(1)), Decimal(0))  # a leases 50.5
            held = await funds_b.hold(ctx_b, Decimal(49))  # all but 0.5 of the rest
            b.free = free_then_answered  # type: ignore[method-assign]
            started = time.monotonic()
            second = await funds_b.hold(ctx_b, Decimal(1))
            assert time.monotonic() - started < RECALL_WAIT_SECONDS
            assert leases(settings) == {b.lease_owner: Decimal(75)}
            funds_b.release(second, Decimal(0))
            funds_b.release(held, Decimal(0))
        finally:
            await b.close()
            await a.close()

    asyncio.run(go())


def test_the_first_worker_to_start_leaves_a_share_for_the_others(settings: Settings) -> None:
    """Alone in the store (the others still starting), a worker of several leases as one of them,
    not the whole pot: the others start with money to lease."""

    async def go() -> dict[str, Decimal]:
        store = open_store(settings)
        await store.start()
        try:
            ctx, _ = await funded_key(store, Decimal(100))
            funds = Funds(store, workers=2)
            funds.release(await funds.hold(ctx, Decimal(1)), Decimal(0))
            return leases(settings)
        finally:
            await store.close()

    assert list(asyncio.run(go()).values()) == [Decimal("50.5")]  # not 100


def test_a_key_change_invalidates_caches_even_when_its_caller_is_cancelled(
    settings: Settings, backend: str
) -> None:
    async def go() -> tuple[bool, bool, bool]:
        store = open_store(settings)
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
            await store.purge_responses(0)  # a write after the delete (SQLite: queued behind it)
            # A moment for the commit's callbacks (the cache's invalidation) to run, and no more:
            # the cache is to say what the store holds right after the change, not eventually.
            await asyncio.sleep(0.01)
            record = await store.get_key(key.id)
            assert record is not None
            deleted = record.deleted_at_ms is not None
            return deleting.cancelled(), deleted, await store.find_key(hash_key(secret)) is None
        finally:
            await store.close()

    cancelled, deleted, forgotten = asyncio.run(go())
    # Either way the cache says what the store holds. SQLite's writer commits a queued change
    # whatever happens to its caller; on PostgreSQL a change cancelled this early never began.
    assert cancelled and forgotten == deleted
    assert deleted or backend == "postgres"


def test_a_lease_grants_a_spare_only_while_the_pot_is_plentiful() -> None:
    """Near the end of a pot every process leases exactly what its hold needs, so no request is
    refused while money sits unused in another process's lease (gateway.store.leasing)."""
    # Alone, a process takes the whole pot: one process is exact with any lease.
    assert grant(Decimal(10), Decimal(1), 1) == Decimal(10)
    # Plentiful: the need plus a share of the rest.
    assert grant(Decimal(100), Decimal(1), 2) == Decimal("50.5")
    # Scarce: the rest's share would cover fewer than SPARE_MIN_HOLDS holds.
    assert SPARE_MIN_HOLDS == 16
    assert grant(Decimal(10), Decimal(1), 2) == Decimal(1)
    assert grant(Decimal(33), Decimal(1), 2) == Decimal(17)  # a spare of exactly 16 holds
    assert grant(Decimal("0.5"), Decimal(1), 3) == 0  # does not fit


def test_every_backend_grants_by_the_one_rule(settings: Settings) -> None:
    """The store's lease (SQLite in Python, PostgreSQL in its gateway_lease function) grants what
    store/leasing.py says, for pots plentiful and scarce, one owner and many."""
    cases = [
        (Decimal(free), Decimal(need), share)
        for free in ("10", "33", "100", "0.000123", "7.5")
        for need in ("1", "0.1", "0.0000137", "8")
        for share in (1, 2, 6)
    ]

    async def go() -> list[Decimal]:
        store = open_store(settings)
        await store.start()
        try:
            got = []
            for free, need, share in cases:
                account = await store.create_account("acct-" + os.urandom(4).hex(), free)
                got.append(await store.lease("account", account.id, need, share, NOW))
            return got
        finally:
            await store.close()

    assert asyncio.run(go()) == [grant(free, need, share) for free, need, share in cases]


def test_the_last_fraction_of_a_nano_dollar_is_still_money(settings: Settings) -> None:
    """Review: a balance, or a key's limit, of $0.0000000005 refused every request, free ones too
    (a refill asked the store for at least a nano-dollar). Spec 2.4 refuses only at or below 0:
    a free request runs on any money left, and one that costs less than what is left runs."""

    async def go() -> None:
        store = open_store(settings)
        await store.start()
        funds = Funds(store, workers=2)
        try:
            ctx, _ = await funded_key(store, Decimal("0.0000000005"))
            free = await funds.hold(ctx, Decimal(0))
            tiny = await funds.hold(ctx, Decimal("1E-13"))
            with pytest.raises(NotCovered) as refused:
                await funds.hold(ctx, Decimal("0.0000000005"))  # 1E-13 of it is held
            assert refused.value.kind == "account"
            for hold in (free, tiny):
                funds.release(hold, Decimal(0))
            assert (await funds.hold(ctx, Decimal("0.0000000005"))).amount == Decimal("0.0000000005")

            account = await store.create_account("acct-limited", Decimal(10))
            secret = generate_key()
            await store.create_key(
                account.id, "k", hash_key(secret), display_prefix(secret), None, credit_limit=Decimal("1E-10")
            )
            limited = await store.find_key(hash_key(secret))
            assert limited is not None
            await funds.hold(limited, Decimal(0))
            await funds.hold(limited, Decimal("1E-11"))
            with pytest.raises(NotCovered) as refused:
                await funds.hold(limited, Decimal("1E-10"))
            assert refused.value.kind == "key"

            empty, _ = await funded_key(store, Decimal(0))
            with pytest.raises(NotCovered):
                await funds.hold(empty, Decimal(0))
        finally:
            await store.close()

    asyncio.run(go())

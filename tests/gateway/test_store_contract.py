"""The store's contract, run against every backend (SQLite and PostgreSQL): money exactly once,
leases within the pot, job claims and idempotency claims exclusive across processes (two store
instances on one database stand for two processes, or two instances of the gateway)."""

from __future__ import annotations

import asyncio
import inspect
import os
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from decimal import Decimal
from typing import Any

import pytest

from gateway.clock import now_ms
from gateway.store import Job, RequestLog, UsageRecord

StoreFactory = Callable[[], Any]


@pytest.fixture(params=["sqlite", "postgres"])
def new_store(request: pytest.FixtureRequest, tmp_path: Any) -> StoreFactory:
    """Makes unstarted stores of one backend, all on the same database."""
    if request.param == "sqlite":
        from gateway.store.sqlite import SqliteStore

        return lambda: SqliteStore(tmp_path / "gateway.db")
    url = request.getfixturevalue("postgres_url")
    from gateway.store.postgres import PostgresStore

    return lambda: PostgresStore(url, pool_size=4)


@asynccontextmanager
async def started(new_store: StoreFactory, count: int = 1) -> AsyncIterator[list[Any]]:
    async with AsyncExitStack() as stack:
        stores = []
        for _ in range(count):
            store = new_store()
            await store.start()
            stack.push_async_callback(store.close)
            stores.append(store)
        yield stores


async def settle(store: Any, record: UsageRecord, entry: RequestLog | None = None) -> None:
    """Settle, whether the backend's settle is awaited (PostgreSQL) or not (SQLite today)."""
    result = store.settle(record, entry)
    if inspect.isawaitable(result):
        await result


async def flush(store: Any) -> None:
    """Let queued writes commit: an awaited write is committed after everything queued before it."""
    await store.purge_images(0)


def record(account_id: str, key_id: str, cost: str, usage_id: str | None = None, **kw: Any) -> UsageRecord:
    now = now_ms()
    fields: dict[str, Any] = {
        "id": usage_id or "chatcmpl-" + os.urandom(8).hex(),
        "request_id": "req_" + os.urandom(8).hex(),
        "key_id": key_id,
        "account_id": account_id,
        "model": "openai/gpt-4o-mini",
        "status": "completed",
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "cost": Decimal(cost),
        "started_at_ms": now - 5,
        "ended_at_ms": now,
    }
    fields.update(kw)
    return UsageRecord(**fields)


def log_entry(r: UsageRecord, **kw: Any) -> RequestLog:
    fields: dict[str, Any] = {
        "id": r.request_id,
        "key_id": r.key_id,
        "account_id": r.account_id,
        "method": "POST",
        "path": "/v1/chat/completions",
        "model": r.model,
        "status": 200,
        "error_code": None,
        "started_at_ms": r.started_at_ms,
        "duration_ms": 5,
        "cost": r.cost,
        "usage_id": r.id,
        "attempts": None,
        "request_body": b'{"x": 1}',
        "request_bytes": 8,
        "response_body": b"{}",
        "response_bytes": 2,
    }
    fields.update(kw)
    return RequestLog(**fields)


async def account_and_key(store: Any, balance: str, credit_limit: str | None = None) -> tuple[str, str]:
    account = await store.create_account("acct-" + os.urandom(6).hex(), Decimal(balance))
    key = await store.create_key(
        account.id,
        "k",
        os.urandom(32),
        "sk-test",
        None,
        credit_limit=None if credit_limit is None else Decimal(credit_limit),
    )
    return account.id, key.id


async def balance(store: Any, account_id: str) -> Decimal:
    account = await store.get_account(account_id)
    assert account is not None
    result: Decimal = account.balance
    return result


def test_settle_charges_exactly_once(new_store: StoreFactory) -> None:
    async def main() -> None:
        async with started(new_store) as [store]:
            account_id, key_id = await account_and_key(store, "10", credit_limit="5")
            r = record(account_id, key_id, "1.2345")
            await settle(store, r, log_entry(r))
            await settle(store, r, log_entry(r))  # replayed: nothing changes
            await flush(store)
            assert await balance(store, account_id) == Decimal("8.7655")
            assert await store.get_usage(r.id, key_id) == r
            assert await store.get_usage(r.id, "key_other") is None
            key = await store.get_key(key_id)
            assert key is not None and key.spent == Decimal("1.2345")
            entry = await store.get_request_log(r.request_id)
            assert entry is not None and entry.cost == r.cost and entry.usage_id == r.id
            assert entry.request_body == b'{"x": 1}'
            listed = await store.list_request_logs(account_id=account_id, key_id=None, before=None, limit=10)
            assert [e.id for e in listed] == [r.request_id] and listed[0].request_body is None

    asyncio.run(main())


def test_concurrent_settles_from_two_processes_lose_no_money(new_store: StoreFactory) -> None:
    async def main() -> None:
        async with started(new_store, 2) as stores:
            account_id, key_id = await account_and_key(stores[0], "100", credit_limit="50")
            records = [record(account_id, key_id, "0.0137") for _ in range(300)]
            await asyncio.gather(*(settle(stores[i % 2], r) for i, r in enumerate(records)))
            # Every one of them again, concurrently: still charged once each.
            await asyncio.gather(*(settle(stores[(i + 1) % 2], r) for i, r in enumerate(records)))
            for store in stores:
                await flush(store)
            assert await balance(stores[0], account_id) == Decimal(100) - 300 * Decimal("0.0137")
            key = await stores[1].get_key(key_id)
            assert key is not None and key.spent == 300 * Decimal("0.0137")

    asyncio.run(main())


def test_leases_never_exceed_the_pot(new_store: StoreFactory) -> None:
    async def main() -> None:
        async with started(new_store, 2) as stores:
            account_id, key_id = await account_and_key(stores[0], "10", credit_limit="4")
            now = now_ms()
            for kind, pot, total in (("account", account_id, Decimal(10)), ("key", key_id, Decimal(4))):
                grants = await asyncio.gather(
                    *(stores[i % 2].lease(kind, pot, Decimal("0.3"), 3, now) for i in range(80))
                )
                assert sum(grants) <= total
                assert sum(1 for g in grants if g > 0) >= 3
                assert await stores[0].free(kind, pot, now) == total - sum(grants)
                # Given back, the pot is whole again.
                for store in stores:
                    mine = sum(g for i, g in enumerate(grants) if i % 2 == stores.index(store))
                    if mine:
                        await store.return_lease(kind, pot, mine)
                assert await stores[1].free(kind, pot, now) == total

    asyncio.run(main())


def test_settlement_takes_the_charge_off_the_lease(new_store: StoreFactory) -> None:
    async def main() -> None:
        async with started(new_store) as [store]:
            account_id, key_id = await account_and_key(store, "10")
            now = now_ms()
            assert await store.lease("account", account_id, Decimal(1), 1, now) == Decimal(10)
            assert await store.free("account", account_id, now) == 0
            await settle(store, record(account_id, key_id, "2.5"))
            await flush(store)
            assert await balance(store, account_id) == Decimal("7.5")
            await store.return_lease("account", account_id, Decimal("7.5"))
            assert await store.free("account", account_id, now) == Decimal("7.5")
            assert await store.free("key", key_id, now) is None  # no credit limit

    asyncio.run(main())


def _job(account_id: str, key_id: str, hold: str) -> Job:
    return Job(
        id="video_" + os.urandom(8).hex(),
        kind="video",
        key_id=key_id,
        account_id=account_id,
        request_id="req_" + os.urandom(8).hex(),
        model="openai/sora-2",
        channel="sim",
        upstream_id="up_" + os.urandom(4).hex(),
        status="queued",
        progress=0,
        hold=Decimal(hold),
        created_at_ms=now_ms(),
        prompt="a cat",
        seconds="4",
        size="720x1280",
    )


def test_job_claims_are_exclusive_and_finishing_charges_once(new_store: StoreFactory) -> None:
    async def main() -> None:
        async with started(new_store, 2) as stores:
            account_id, key_id = await account_and_key(stores[0], "100")
            now = now_ms()
            await stores[0].lease("account", account_id, Decimal(20), 1, now)
            jobs = [_job(account_id, key_id, "1") for _ in range(20)]
            for job in jobs:
                await stores[0].create_job(job, [("account", account_id)])
            await stores[0].return_lease("account", account_id, Decimal(100 - 20))
            assert await stores[1].free("account", account_id, now) == Decimal(80)
            later = now_ms() + 10
            claims = await asyncio.gather(
                *(stores[i % 2].claim_jobs(later, 60_000, 3) for i in range(10)), return_exceptions=False
            )
            claimed = [job.id for batch in claims for job in batch]
            assert sorted(claimed) == sorted(job.id for job in jobs)  # each once, none twice
            assert await stores[0].claim_jobs(later, 60_000, 100) == []  # all leased
            # Both processes end the first job at once: one charge, one hold back.
            first = jobs[0]
            r = record(account_id, key_id, "0.75", usage_id=first.id, request_id=first.request_id)
            ended = await asyncio.gather(
                *(
                    store.finish_job(
                        first.id,
                        "completed",
                        error=None,
                        record=r,
                        now_ms=later,
                        content=b"mp4",
                        ttl_ms=60_000,
                    )
                    for store in stores
                )
            )
            assert sorted(ended) == [False, True]
            assert await balance(stores[0], account_id) == Decimal("99.25")
            assert await stores[0].free("account", account_id, later) == Decimal("99.25") - 19
            assert await stores[1].get_video_content(first.id, key_id, later) == (b"mp4", "video/mp4")
            done = await stores[1].get_job(first.id, key_id, "video")
            assert done is not None and done.status == "completed" and done.cost == Decimal("0.75")

    asyncio.run(main())


def test_idempotency_claims_across_processes(new_store: StoreFactory) -> None:
    from gateway.store import StoredAnswer

    async def main() -> None:
        async with started(new_store, 2) as stores:
            now = now_ms()
            claims = await asyncio.gather(
                *(
                    stores[i % 2].claim_idempotency("key_1", "idem-1", "fp", now, 1000, 86_400_000)
                    for i in range(20)
                )
            )
            outcomes = sorted(c.outcome for c in claims)
            assert outcomes == ["in_progress"] * 19 + ["run"]
            assert (
                await stores[0].claim_idempotency("key_1", "idem-1", "other", now, 1000, 10)
            ).outcome == "reused"
            answer = StoredAnswer(200, (("content-type", "application/json"),), b"{}")
            await stores[1].finish_idempotency("key_1", "idem-1", "fp", answer, now, 86_400_000)
            replay = await stores[0].claim_idempotency("key_1", "idem-1", "fp", now, 1000, 86_400_000)
            assert replay.outcome == "replay" and replay.answer == answer
            # A lease that ran out (its process died): the next request takes the key over.
            await stores[0].claim_idempotency("key_1", "idem-2", "fp", now, 1000, 86_400_000)
            taken = await stores[1].claim_idempotency("key_1", "idem-2", "fp", now + 1001, 1000, 86_400_000)
            assert taken.outcome == "run"

    asyncio.run(main())


def test_top_up_idempotency_and_ledger(new_store: StoreFactory) -> None:
    from gateway.store import IdempotencyKeyReused, NameTaken

    async def main() -> None:
        async with started(new_store) as [store]:
            account_id, _ = await account_and_key(store, "1")
            results = await asyncio.gather(
                *(store.top_up(account_id, Decimal("2.5"), "n", "t-1") for _ in range(5))
            )
            assert sorted(again for _, again in results if True) == [False, True, True, True, True]
            assert await balance(store, account_id) == Decimal("3.5")
            with pytest.raises(IdempotencyKeyReused):
                await store.top_up(account_id, Decimal(3), "n", "t-1")
            entry, _ = await store.top_up(account_id, Decimal("0.5"), None)
            assert entry.balance_after == Decimal(4)
            ledger = await store.list_top_ups(account_id)
            assert [t.amount for t in ledger] == [Decimal("2.5"), Decimal("0.5")]
            assert await store.list_top_ups(account_id, after=ledger[0].id) == ledger[1:]
            assert await store.top_up("acct_missing", Decimal(1), None) is None
            account = await store.get_account(account_id)
            with pytest.raises(NameTaken):
                await store.create_account(account.name, Decimal(0))

    asyncio.run(main())


def test_key_changes_reach_the_cache(new_store: StoreFactory) -> None:
    async def main() -> None:
        async with started(new_store) as [store]:
            account = await store.create_account("acct-" + os.urandom(6).hex(), Decimal(1))
            secret = os.urandom(32)
            key = await store.create_key(account.id, "k", secret, "sk-a", None)
            found = await store.find_key(secret)
            assert found is not None and found.key.id == key.id and found.account.id == account.id
            await store.update_account(account.id, {"rpm_limit": 7, "allowed_models": frozenset({"m"})})
            found = await store.find_key(secret)
            assert found is not None and found.account.rpm_limit == 7
            assert found.account.allowed_models == frozenset({"m"})
            assert await store.delete_key(key.id)
            assert await store.find_key(secret) is None
            assert not await store.delete_key(key.id)

    asyncio.run(main())

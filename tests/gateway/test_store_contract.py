"""The store's contract, run against every backend (SQLite and PostgreSQL): money exactly once,
leases within the pot, job claims and idempotency claims exclusive across processes (two store
instances on one database stand for two processes, or two instances of the gateway)."""

from __future__ import annotations

import asyncio
import inspect
import os
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import replace
from decimal import Decimal
from typing import Any

import pytest

from gateway.clock import now_ms
from gateway.store import Job, RequestLog, UsageRecord
from harness import eventually_async

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


def test_a_recall_asks_every_other_process_and_each_answers_once(new_store: StoreFactory) -> None:
    """recall flags the other processes' leases on the pot (not the caller's, not a job's) and says
    what they amount to; each owner sees its flag in `recalls` until it answers, giving back what
    it chose to; `recall_pending` is true until the last has answered."""

    async def main() -> None:
        async with started(new_store, 3) as [a, b, c]:
            account_id, key_id = await account_and_key(a, "10")
            now = now_ms()
            assert await a.lease("account", account_id, Decimal(1), 1, now) == Decimal(1) + Decimal(9)
            await a.return_lease("account", account_id, Decimal(6))  # a keeps 4
            assert await b.lease("account", account_id, Decimal(3), 4, now) == Decimal(3)
            assert await c.lease("account", account_id, Decimal(2), 4, now) == Decimal(2)
            assert await c.recall("account", account_id) == Decimal(7)  # a's 4 and b's 3
            assert await a.recalls() == [("account", account_id)]
            assert await b.recalls() == [("account", account_id)]
            assert await c.recalls() == []
            assert await c.recall_pending("account", account_id)
            await a.answer_recall("account", account_id, Decimal(4))
            assert await a.recalls() == []
            assert await c.recall_pending("account", account_id)  # b has not answered
            await b.answer_recall("account", account_id, Decimal(0))  # b's 3 is all held
            assert not await c.recall_pending("account", account_id)
            assert await c.free("account", account_id, now) == Decimal(5)  # 10 - b's 3 - c's 2
            assert await c.lease("account", account_id, Decimal(5), 4, now) == Decimal(5)
            # Nobody else leases the key's pot (no credit limit): nothing to ask.
            assert await a.recall("key", key_id) == 0

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


def test_a_jobs_key_is_found_within_its_account_only(new_store: StoreFactory) -> None:
    async def main() -> None:
        async with started(new_store) as [store]:
            account_id, key_id = await account_and_key(store, "100")
            other_account, _ = await account_and_key(store, "100")
            await store.lease("account", account_id, Decimal(1), 1, now_ms())
            job = _job(account_id, key_id, "1")
            await store.create_job(job, [("account", account_id)])
            assert await store.job_key(job.id, account_id, "video") == key_id
            assert await store.job_key(job.id, other_account, "video") is None
            assert await store.job_key(job.id, account_id, "response") is None
            assert await store.job_key("video_unknown", account_id, "video") is None
            # Ended, so that no other test's claim finds it (the PostgreSQL database is shared).
            assert await store.finish_job(job.id, "failed", error=None, record=None, now_ms=now_ms())

    asyncio.run(main())


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
            # Claims let go (a process stopping mid-poll) are claimable at once, by the other
            # process; a finished job's stays finished.
            await stores[0].release_jobs([jobs[1].id, jobs[2].id, first.id])
            await stores[0].release_jobs([])
            again = await stores[1].claim_jobs(later, 60_000, 100)
            assert sorted(job.id for job in again) == sorted([jobs[1].id, jobs[2].id])
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


def test_an_answer_kept_with_its_charge_is_replayed_and_charged_once(new_store: StoreFactory) -> None:
    """Store.settle keeps an Idempotency-Key's answer in the same step as the charge (review: a
    process killed between the two left a charge whose key a retry ran and was charged for again);
    settled again (a replayed journal, a retried batch), nothing changes."""
    from gateway.store import KeptAnswer, StoredAnswer

    day = 86_400_000

    async def main() -> None:
        async with started(new_store, 2) as (a, b):
            account_id, key_id = await account_and_key(a, "10")
            now = now_ms()
            assert (await a.claim_idempotency(key_id, "idem-1", "fp", now, 60_000, day)).outcome == "run"
            answer = StoredAnswer(200, (("content-type", "audio/mpeg"),), bytes(range(256)) * 40)
            kept = KeptAnswer(key_id, "idem-1", "fp", answer, now + day)
            r = record(account_id, key_id, "0.25")
            await a.settle(r, log_entry(r), kept)
            await a.settle(r, log_entry(r), kept)
            await flush(a)
            replay = await b.claim_idempotency(key_id, "idem-1", "fp", now, 60_000, day)
            assert replay.outcome == "replay" and replay.answer == answer
            assert await balance(b, account_id) == Decimal("9.75")
            # An answer finishes only the claim of the request that made it.
            assert (await a.claim_idempotency(key_id, "idem-2", "fp", now, 60_000, day)).outcome == "run"
            other = KeptAnswer(key_id, "idem-2", "another body", answer, now + day)
            r2 = record(account_id, key_id, "0.5")
            await a.settle(r2, log_entry(r2), other)
            await flush(a)
            assert (
                await b.claim_idempotency(key_id, "idem-2", "fp", now, 60_000, day)
            ).outcome == "in_progress"
            assert await balance(b, account_id) == Decimal("9.25")

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
            # The account's starting balance is the ledger's first entry.
            assert [(t.amount, t.note) for t in ledger] == [
                (Decimal(1), "opening balance"),
                (Decimal("2.5"), "n"),
                (Decimal("0.5"), None),
            ]
            assert await store.list_top_ups(account_id, after=ledger[0].id) == ledger[1:]
            assert await store.top_up("acct_missing", Decimal(1), None) is None
            account = await store.get_account(account_id)
            with pytest.raises(NameTaken):
                await store.create_account(account.name, Decimal(0))
            assert await store.list_top_ups((await store.create_account("empty", Decimal(0))).id) == []

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


# ---------------------------------------------------------------------- the console


async def logged(store: Any, *entries: RequestLog) -> None:
    """Keep the entries (log_request, in this order) and wait until every one can be read."""
    for entry in entries:
        store.log_request(entry)

    async def written() -> bool:
        await flush(store)
        return all([await store.get_request_log(e.id) is not None for e in entries])

    await eventually_async(written, 5, 0.01, what="the log entries written")


def test_console_users_and_invitations(new_store: StoreFactory) -> None:
    from gateway.store import ConsoleSession, NameTaken

    async def main() -> None:
        async with started(new_store) as [store]:
            account_id, _ = await account_and_key(store, "1")
            now = now_ms()
            email = f"Ann.{os.urandom(4).hex()}@Example.COM"
            invite = os.urandom(32)
            ann = await store.create_console_user(email, "member", account_id, invite, now + 1000)
            assert ann.id.startswith("cu_") and ann.email == email.lower() and ann.password_hash is None
            assert await store.get_console_user(ann.id) == ann
            assert await store.find_console_user(email.upper()) == ann
            assert await store.find_console_user("nobody@example.com") is None
            with pytest.raises(NameTaken):
                await store.create_console_user(email.swapcase(), "operator", None, None, None)
            # The invitation is found by its token's hash until it expires.
            assert await store.find_console_invite(invite, now) == ann
            assert await store.find_console_invite(invite, now + 1000) is None
            assert await store.find_console_invite(os.urandom(32), now) is None
            operator = await store.create_console_user(
                f"op.{os.urandom(4).hex()}@example.com", "operator", None, None, None
            )
            listed = await store.list_console_users()
            assert [u.id for u in listed if u.id in (ann.id, operator.id)] == [ann.id, operator.id]
            assert await store.list_console_users(account_id) == [ann]
            # A password closes the invitation: the link works once.
            assert await store.set_console_password(ann.id, "$argon2id$one")
            ann = await store.get_console_user(ann.id)
            assert ann.password_hash == "$argon2id$one" and ann.invite_hash is None
            assert ann.invite_expires_at_ms is None
            assert await store.find_console_invite(invite, now) is None
            assert not await store.set_console_password("cu_missing", "x")
            # A new invitation (the operator resets the password) ends the user's sessions.
            session = ConsoleSession(
                os.urandom(32), ann.id, "member", account_id, "csrf", now, now, now + 10**6
            )
            await store.create_console_session(session)
            assert await store.get_console_session(session.id) == session
            again = os.urandom(32)
            assert await store.set_console_invite(ann.id, again, now + 5000)
            assert await store.get_console_session(session.id) is None
            ann = await store.get_console_user(ann.id)
            assert (
                ann.password_hash is None
                and ann.invite_hash == again
                and ann.invite_expires_at_ms == now + 5000
            )
            assert await store.find_console_invite(again, now) == ann
            assert not await store.set_console_invite("cu_missing", os.urandom(32), now)
            # Accepting an invitation succeeds only while that very invitation is open: the old
            # link, an expired one, and a second use all fail.
            assert not await store.set_console_password(ann.id, "$argon2id$old", (invite, now))
            assert not await store.set_console_password(ann.id, "$argon2id$late", (again, now + 5000))
            assert await store.set_console_password(ann.id, "$argon2id$two", (again, now))
            assert not await store.set_console_password(ann.id, "$argon2id$twice", (again, now))
            assert (await store.get_console_user(ann.id)).password_hash == "$argon2id$two"
            # A new password ends the sessions signed in with the old one (review: the demo's
            # password, new each run, left the last run's sessions open); a refused change ends none.
            session = ConsoleSession(os.urandom(32), ann.id, "member", account_id, "c", now, now, now + 10**6)
            await store.create_console_session(session)
            assert not await store.set_console_password(ann.id, "$argon2id$x", (again, now))
            assert await store.get_console_session(session.id) == session
            assert await store.set_console_password(ann.id, "$argon2id$three")
            assert await store.get_console_session(session.id) is None
            # Deleting a user ends their sessions too.
            session = ConsoleSession(os.urandom(32), ann.id, "member", account_id, "c", now, now, now + 10**6)
            await store.create_console_session(session)
            assert await store.delete_console_user(ann.id)
            assert await store.get_console_user(ann.id) is None
            assert await store.get_console_session(session.id) is None
            assert not await store.delete_console_user(ann.id)
            assert await store.list_console_users(account_id) == []

    asyncio.run(main())


def test_console_sessions(new_store: StoreFactory) -> None:
    from gateway.store import ConsoleSession

    async def main() -> None:
        async with started(new_store) as [store]:
            now = now_ms()
            hour = 3_600_000

            def session(seen: int, expires: int) -> ConsoleSession:
                return ConsoleSession(
                    os.urandom(32), None, "operator", None, "csrf", now - 10 * hour, seen, expires
                )

            fresh = session(now - 1000, now + hour)
            idle = session(now - 2 * hour, now + hour)
            expired = session(now - 1000, now)
            for s in (fresh, idle, expired):
                await store.create_console_session(s)
            assert await store.get_console_session(fresh.id) == fresh
            assert await store.get_console_session(os.urandom(32)) is None
            await store.touch_console_session(fresh.id, now - 10)
            touched = await store.get_console_session(fresh.id)
            assert touched is not None and touched.seen_at_ms == now - 10
            # Past the absolute expiry, or idle for an hour: gone.
            assert await store.purge_console_sessions(now, hour) >= 2
            assert await store.get_console_session(fresh.id) == touched
            assert await store.get_console_session(idle.id) is None
            assert await store.get_console_session(expired.id) is None
            await store.delete_console_session(fresh.id)
            assert await store.get_console_session(fresh.id) is None

    asyncio.run(main())


def test_conversations_belong_to_their_account(new_store: StoreFactory) -> None:
    from gateway.store import ChatMessage, Conversation

    async def main() -> None:
        async with started(new_store) as [store]:
            mine, _ = await account_and_key(store, "1")
            other, _ = await account_and_key(store, "1")
            now = now_ms()

            def conversation(account_id: str, at: int) -> Conversation:
                return Conversation("conv_" + os.urandom(12).hex(), account_id, None, "Hello", at, at)

            def message(conversation_id: str, role: str, at: int, cost: str | None = None) -> ChatMessage:
                return ChatMessage(
                    id="msg_" + os.urandom(12).hex(),
                    conversation_id=conversation_id,
                    role=role,
                    content=f"{role} says hi",
                    model=None if cost is None else "openai/gpt-4o-mini",
                    request_id=None if cost is None else "req_" + os.urandom(8).hex(),
                    prompt_tokens=None if cost is None else 12,
                    completion_tokens=None if cost is None else 30,
                    cost=None if cost is None else Decimal(cost),
                    created_at_ms=at,
                )

            first, second, theirs = (
                conversation(mine, now),
                conversation(mine, now + 1),
                conversation(other, now),
            )
            for c in (first, second, theirs):
                await store.create_conversation(c)
            assert await store.list_conversations(mine) == [second, first]
            assert await store.list_conversations(other) == [theirs]
            # Another account's conversation is not there for this one.
            assert await store.get_conversation(first.id, other) is None
            assert not await store.rename_conversation(first.id, other, "Mine now")
            assert not await store.delete_conversation(first.id, other)
            assert not await store.add_chat_message(message(first.id, "user", now + 5), other)
            assert await store.get_conversation("conv_missing", mine) is None
            # Messages come back in order, with their exact cost; the conversation moves to the top.
            asked = message(first.id, "user", now + 10)
            answered = message(first.id, "assistant", now + 11, cost="0.0000001234")
            assert await store.add_chat_message(asked, mine)
            assert await store.add_chat_message(answered, mine)
            found = await store.get_conversation(first.id, mine)
            assert found is not None
            got, messages = found
            assert got.updated_at_ms == now + 11 and got.title == "Hello"
            assert messages == [asked, answered] and messages[1].cost == Decimal("1.234E-7")
            assert [c.id for c in await store.list_conversations(mine)] == [first.id, second.id]
            assert await store.rename_conversation(first.id, mine, "Renamed")
            found = await store.get_conversation(first.id, mine)
            assert found is not None and found[0].title == "Renamed"
            # Deleting it deletes its messages: made again under the same id, it has none.
            assert await store.delete_conversation(first.id, mine)
            assert await store.get_conversation(first.id, mine) is None
            assert not await store.delete_conversation(first.id, mine)
            await store.create_conversation(first)
            assert await store.get_conversation(first.id, mine) == (first, [])
            assert [c.id for c in await store.list_conversations(other)] == [theirs.id]

    asyncio.run(main())


def test_kept_responses_form_conversations_of_their_account(new_store: StoreFactory) -> None:
    from gateway.store import KeptResponse

    async def main() -> None:
        async with started(new_store) as [store]:
            mine, _ = await account_and_key(store, "1")
            other, _ = await account_and_key(store, "1")
            now = now_ms()
            tag = os.urandom(6).hex()

            def turn(n: int, previous: int | None, account: str = mine) -> KeptResponse:
                return KeptResponse(
                    id=f"resp_{tag}{n}",
                    account_id=account,
                    model="openai/gpt-4o-mini",
                    previous_id=None if previous is None else f"resp_{tag}{previous}",
                    items=f'[{{"id": "msg_{tag}{n}"}}]'.encode(),
                    body=f'{{"id": "resp_{tag}{n}"}}'.encode(),
                )

            first, second, third = turn(1, None), turn(2, 1), turn(3, 2)
            await store.keep_response(first, now + 100)
            await store.keep_response(second, now + 200)
            await store.keep_response(third, now + 300)
            assert await store.find_kept_response(second.id, mine, now) == second
            # The conversation, oldest turn first; the walk stops once past the byte limit.
            assert await store.kept_conversation(third.id, mine, now, 10_000) == [
                first.items,
                second.items,
                third.items,
            ]
            assert await store.kept_conversation(third.id, mine, now, 1) == [third.items]
            at_most = len(third.items)
            assert await store.kept_conversation(third.id, mine, now, at_most) == [second.items, third.items]
            assert await store.kept_conversation(second.id, mine, now, 10_000) == [first.items, second.items]
            # A conversation lasts from its last turn: the first outlives the expiry it was kept with.
            assert await store.kept_conversation(third.id, mine, now + 250, 10_000) is not None
            assert await store.find_kept_response(first.id, mine, now + 250) is not None
            # Nothing of it is another account's, and an expired one is gone.
            assert await store.kept_conversation(third.id, other, now, 10_000) is None
            assert await store.find_kept_response(third.id, other, now) is None
            assert await store.kept_conversation(third.id, mine, now + 300, 10_000) is None
            assert await store.kept_items([first.id, third.id, "resp_missing"], mine, now) == {
                first.id: first.items,
                third.id: third.items,
            }
            assert await store.kept_items([first.id], other, now) == {}
            assert await store.kept_items([], mine, now) == {}
            # A turn that names another conversation's items keeps that one as long as itself.
            named, naming = turn(4, None), turn(5, None)
            await store.keep_response(named, now + 100)
            await store.keep_response(naming, now + 400, touches=[named.id, "resp_missing"])
            assert await store.kept_items([named.id], mine, now + 350) == {named.id: named.items}
            theirs = turn(6, None, account=other)
            await store.keep_response(theirs, now + 50)
            assert await store.purge_responses(now + 100) == 1
            assert await store.find_kept_response(theirs.id, other, now) is None
            assert await store.find_kept_response(first.id, mine, now) is not None
            assert await store.purge_responses(now + 300) == 3
            assert await store.kept_items([first.id, second.id, third.id], mine, now) == {}
            assert await store.find_kept_response(named.id, mine, now) is not None

    asyncio.run(main())


def test_a_deleted_kept_response_leaves_a_gap_and_a_forgotten_state_is_gone(new_store: StoreFactory) -> None:
    from gateway.store import ConversationGap, KeptResponse, ResponseState

    async def main() -> None:
        async with started(new_store) as [store]:
            mine, _ = await account_and_key(store, "1")
            other, _ = await account_and_key(store, "1")
            now = now_ms()
            tag = os.urandom(6).hex()
            ids = [f"resp_{tag}{n}" for n in range(3)]
            for n, rid in enumerate(ids):
                previous = ids[n - 1] if n else None
                kept = KeptResponse(rid, mine, "openai/gpt-4o-mini", previous, b"[]", b"{}")
                await store.keep_response(kept, now + 1_000)
            # Only its own account deletes it, once.
            assert not await store.delete_kept_response(ids[1], other)
            assert await store.delete_kept_response(ids[1], mine)
            assert not await store.delete_kept_response(ids[1], mine)
            assert await store.find_kept_response(ids[1], mine, now) is None
            # The turn after it reaches the gap; the turn before it is whole.
            with pytest.raises(ConversationGap) as gap:
                await store.kept_conversation(ids[2], mine, now, 10_000)
            assert gap.value.missing == ids[1]
            assert await store.kept_conversation(ids[0], mine, now, 10_000) == [b"[]"]
            # A walk stopped by its byte limit before the gap is not a gap.
            assert await store.kept_conversation(ids[2], mine, now, 1) == [b"[]"]
            state = ResponseState(
                f"resp_{tag}up", mine, "openai/gpt-4.1-mini", "http://u/v1", "up_1", now + 1_000
            )
            await store.remember_response(state)
            # Found by the upstream's id too: the account's, on its upstream, while unexpired.
            upstream = ("up_1", "http://u/v1")
            assert await store.gateway_response_id(*upstream, mine, now) == state.id
            assert await store.gateway_response_id(*upstream, other, now) is None
            assert await store.gateway_response_id("up_1", "http://other/v1", mine, now) is None
            assert await store.gateway_response_id(*upstream, mine, now + 1_000) is None
            assert not await store.forget_response(state.id, other)
            assert await store.forget_response(state.id, mine)
            assert await store.find_response(state.id, mine, now) is None
            assert not await store.forget_response(state.id, mine)

    asyncio.run(main())


def test_an_upstream_s_output_items_are_known_to_their_account_only(new_store: StoreFactory) -> None:
    """The items of responses upstreams keep, recorded by account (security review: any account
    could name another's by the upstream's id): known to theirs while unexpired, a later expiry
    winning, purged with the response states."""

    async def main() -> None:
        async with started(new_store) as [store]:
            mine, _ = await account_and_key(store, "1")
            other, _ = await account_and_key(store, "1")
            now = now_ms()
            tag = os.urandom(6).hex()
            first, second, third = f"msg_{tag}1", f"fc_{tag}2", f"rs_{tag}3"
            await store.remember_items(mine, [first, second, first], now + 100)
            await store.remember_items(mine, [], now + 100)
            await store.remember_items(other, [third], now + 100)
            assert await store.known_items(mine, [first, second, third, "msg_nope"], now) == {first, second}
            assert await store.known_items(other, [first, third], now) == {third}
            assert await store.known_items(mine, [], now) == set()
            await store.remember_items(mine, [second], now + 500)  # named again by a later turn
            await store.remember_items(mine, [second], now + 50)  # an earlier expiry changes nothing
            assert await store.known_items(mine, [first, second], now + 100) == {second}
            # (at least: on PostgreSQL the database is shared, and other tests' expired rows go too)
            assert await store.purge_responses(now + 100) >= 2
            assert await store.known_items(mine, [first, second], now) == {second}
            assert await store.known_items(other, [third], now) == set()

    asyncio.run(main())


def test_request_log_filters_and_paging(new_store: StoreFactory) -> None:
    from gateway.store import LogQuery

    async def main() -> None:
        async with started(new_store) as [store]:
            account_id, key_id = await account_and_key(store, "10")
            _, other_key = await account_and_key(store, "10")
            other_account = (await store.get_key(other_key)).account_id
            second_key = (await store.create_key(account_id, "k2", os.urandom(32), "sk-2", None)).id
            base = now_ms() - 3_600_000
            entries = []
            # One entry a minute: (key, model, status, path), newest last.
            shapes = [
                (key_id, "openai/gpt-4o-mini", 200, "/v1/chat/completions"),
                (key_id, "openai/gpt-4o-mini", 429, "/v1/chat/completions"),
                (second_key, "meta/llama-3.1-8b", 200, "/v1/chat/completions"),
                (second_key, "openai/text-embedding-3-small", 200, "/v1/embeddings"),
                (key_id, "meta/llama-3.1-8b", 502, "/v1/chat/completions"),
                (other_key, "openai/gpt-4o-mini", 200, "/v1/chat/completions"),
                (key_id, None, 404, "/v1/chat/completions"),
                (second_key, "openai/gpt-4o-mini", 200, "/v1/responses"),
            ]
            for i, (key, model, status, path) in enumerate(shapes):
                owner = other_account if key == other_key else account_id
                r = record(owner, key, "0.001", started_at_ms=base + i * 60_000)
                entries.append(
                    log_entry(
                        r,
                        model=model,
                        status=status,
                        path=path,
                        cost=r.cost if status == 200 else None,
                        usage_id=r.id if status == 200 else None,
                    )
                )
            await logged(store, *entries)

            async def ids(query: LogQuery | None = None, **kw: Any) -> list[int]:
                args: dict[str, Any] = {"account_id": None, "key_id": None, "before": None, "limit": 100}
                args.update(kw)
                listed = await store.list_request_logs(**args, query=query)
                index = {e.id: i for i, e in enumerate(entries)}
                assert all(e.request_body is None for e in listed)
                return [index[e.id] for e in listed if e.id in index]

            mine = LogQuery(account_id=account_id)
            assert await ids(mine) == [7, 6, 4, 3, 2, 1, 0]
            assert await ids(account_id=account_id) == [7, 6, 4, 3, 2, 1, 0]  # as before, no query
            assert await ids(LogQuery(account_id=account_id, key_id=second_key)) == [7, 3, 2]
            assert await ids(LogQuery(key_id=second_key), account_id=account_id) == [7, 3, 2]
            assert await ids(LogQuery(account_id=account_id, model="openai/gpt-4o-mini")) == [7, 1, 0]
            assert await ids(LogQuery(model="openai/gpt-4o-mini")) == [7, 5, 1, 0]
            assert await ids(LogQuery(account_id=account_id, status=429)) == [1]
            assert await ids(LogQuery(account_id=account_id, status_class=2)) == [7, 3, 2, 0]
            assert await ids(LogQuery(account_id=account_id, status_class=4)) == [6, 1]
            assert await ids(LogQuery(account_id=account_id, status_class=5)) == [4]
            assert await ids(LogQuery(account_id=account_id, path="/v1/embeddings")) == [3]
            window = LogQuery(account_id=account_id, since_ms=base + 2 * 60_000, until_ms=base + 6 * 60_000)
            assert await ids(window) == [4, 3, 2]
            assert await ids(LogQuery(account_id=account_id, until_ms=base + 60_000)) == [0]
            assert await ids(LogQuery(account_id=account_id, since_ms=base + 6 * 60_000)) == [7, 6]
            # A request id: the entry's own, or its usage record's (the response body's id).
            assert await ids(LogQuery(request_id=entries[4].id)) == [4]
            assert await ids(LogQuery(account_id=account_id, request_id=entries[4].id)) == [4]
            assert await ids(LogQuery(account_id=other_account, request_id=entries[4].id)) == []
            assert await ids(LogQuery(request_id="req_missing")) == []
            # A job's id (a video's, running or failed, without a usage record): the entry that
            # started it (console review).
            job = replace(_job(account_id, second_key, "0.5"), request_id=entries[2].id)
            await store.lease("account", account_id, Decimal("0.5"), 1, now_ms())
            await store.create_job(job, [("account", account_id)])
            assert await ids(LogQuery(account_id=account_id, request_id=job.id)) == [2]
            assert await ids(LogQuery(account_id=other_account, request_id=job.id)) == []
            # Every filter at once.
            every = LogQuery(
                account_id=account_id,
                key_id=second_key,
                model="openai/gpt-4o-mini",
                status=200,
                status_class=2,
                path="/v1/responses",
                since_ms=base,
                until_ms=base + 3_600_000,
            )
            assert await ids(every) == [7]
            # A query naming another account than the caller's finds nothing.
            assert await ids(LogQuery(account_id=other_account), account_id=account_id) == []
            assert await ids(LogQuery(key_id=other_key), key_id=key_id) == []
            # Pages of a filtered list: `before` is the last entry of the previous page.
            pages, before = [], None
            while True:
                page = await store.list_request_logs(
                    account_id=account_id, key_id=None, before=before, limit=2, query=LogQuery(status_class=2)
                )
                if not page:
                    break
                pages.append([e.id for e in page])
                before = page[-1].id
            assert pages == [[entries[7].id, entries[3].id], [entries[2].id, entries[0].id]]
            # Another account's entry as the cursor reads as an unknown one: it says nothing.
            assert await ids(mine, before=entries[5].id) == []
            assert await ids(account_id=account_id, before=entries[5].id) == []
            assert await ids(mine, before=entries[4].id) == [3, 2, 1, 0]
            # A settled request is found by its usage id too.
            r = record(account_id, key_id, "0.25")
            await settle(store, r, log_entry(r))
            for _ in range(500):
                if await store.get_request_log(r.request_id) is not None:
                    break
                await flush(store)
                await asyncio.sleep(0.01)
            for wanted in (r.id, r.request_id):
                found = await store.list_request_logs(
                    account_id=None, key_id=None, before=None, limit=5, query=LogQuery(request_id=wanted)
                )
                assert [e.id for e in found] == [r.request_id] and found[0].usage_id == r.id
            # A page's usage records in one read, only the account's own.
            usages = await store.account_usages(account_id, [r.id, r.id, "chatcmpl-missing"])
            assert [(u.id, u.cost) for u in usages] == [(r.id, r.cost)]
            assert await store.account_usages(other_account, [r.id]) == []
            assert await store.account_usages(account_id, []) == []

    asyncio.run(main())


def test_log_stats_buckets_and_models(new_store: StoreFactory) -> None:
    async def main() -> None:
        async with started(new_store) as [store]:
            account_id, key_id = await account_and_key(store, "10")
            other_account, other_key = await account_and_key(store, "10")
            hour = 3_600_000
            since = (now_ms() // hour - 30 * 24) * hour  # a month ago: no other test's entries
            until = since + 4 * hour + hour // 2  # the last bucket is half an hour
            entries = []

            def add(
                at: int, model: str | None, status: int, cost: str | None, account: str = account_id
            ) -> None:
                key = key_id if account == account_id else other_key
                r = record(account, key, cost or "0", started_at_ms=since + at)
                cost_value = None if cost is None else Decimal(cost)
                entries.append(log_entry(r, model=model, status=status, cost=cost_value, usage_id=None))

            m = 60_000
            add(0, "openai/gpt-4o-mini", 200, "0.1")
            add(5 * m, "openai/gpt-4o-mini", 200, "0.0000001234")  # kept as "1.234E-7"
            add(59 * m, "meta/llama-3.1-8b", 500, None)
            add(hour + hour, "meta/llama-3.1-8b", 200, "1.5")  # the second bucket stays empty
            add(2 * hour + 10 * m, "openai/gpt-4o-mini", 499, None)
            add(2 * hour + 20 * m, None, 401, None)
            add(3 * hour, "openai/gpt-4o-mini", 200, "0.0000000000001")  # 13 decimal places
            add(3 * hour + m, "openai/gpt-4o-mini", 200, "12345.6789")
            for i in range(10):  # picodollars beyond 64 bits, summed
                add(4 * hour + i * m, "anthropic/claude-sonnet-4-5", 200, "999999.999999")
            add(4 * hour + 40 * m, "openai/gpt-4o-mini", 200, "7")  # after `until`
            add(-1, "openai/gpt-4o-mini", 200, "7")  # before `since`
            add(30 * m, "openai/gpt-4o-mini", 200, "0.5", account=other_account)
            await logged(store, *entries)

            stats = await store.log_stats(account_id, since, until, hour)
            assert [(b.start_ms - since) // hour for b in stats.buckets] == [0, 1, 2, 3, 4]
            assert [(b.requests, b.errors, b.cost) for b in stats.buckets] == [
                (3, 1, Decimal("0.1000001234")),
                (0, 0, Decimal(0)),
                (3, 2, Decimal("1.5")),
                (2, 0, Decimal("12345.6789000000001")),
                (10, 0, Decimal("9999999.99999")),
            ]
            assert stats.by_model == (
                ("anthropic/claude-sonnet-4-5", 10, Decimal("9999999.99999")),
                ("openai/gpt-4o-mini", 5, Decimal("12345.7789001234001")),
                ("meta/llama-3.1-8b", 2, Decimal("1.5")),
            )
            # Every account: the other one's entry too.
            every = await store.log_stats(None, since, until, hour)
            assert every.buckets[0].requests == 4 and every.buckets[0].cost == Decimal("0.6000001234")
            assert every.by_model[1] == ("openai/gpt-4o-mini", 6, Decimal("12346.2789001234001"))
            # Second buckets: a few hundred, then thousands (SQLite groups those in one query a model).
            fine = await store.log_stats(account_id, since, since + 6 * m, 1000)
            assert len(fine.buckets) == 360
            assert [(i, b.requests, b.cost) for i, b in enumerate(fine.buckets) if b.requests] == [
                (0, 1, Decimal("0.1")),
                (300, 1, Decimal("1.234E-7")),
            ]
            assert sum(b.requests for b in fine.buckets) == 2
            many = await store.log_stats(account_id, since, until, 1000)
            assert len(many.buckets) == 16_200 and sum(b.requests for b in many.buckets) == 18
            assert sum(b.cost for b in many.buckets) == sum(b.cost for b in stats.buckets)
            assert many.by_model == stats.by_model
            # An empty period.
            empty = await store.log_stats(account_id, since, since, hour)
            assert empty.buckets == () and empty.by_model == ()

    asyncio.run(main())

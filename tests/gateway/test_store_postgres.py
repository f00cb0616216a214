"""What only the PostgreSQL store has: owners and their reclaim across instances, the key cache's
cross-instance invalidation, concurrent migrations, and recovery when the database goes away."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest
from test_store_contract import account_and_key, balance, log_entry, record

from gateway.budget import period_start_ms
from gateway.clock import now_ms
from gateway.store import Settlement
from gateway.store.postgres import PostgresStore, StoreUnavailable, rows
from gateway.store.postgres import store as store_module
from gateway.store.postgres.migrate import migrations
from harness import eventually_async


@asynccontextmanager
async def stores(url: str, count: int) -> AsyncIterator[list[PostgresStore]]:
    opened = [PostgresStore(url, pool_size=4) for _ in range(count)]
    for store in opened:
        await store.start()
    try:
        yield opened
    finally:
        for store in opened:
            await store.close()


async def admin(url: str, sql: str, *args: Any) -> Any:
    conn = await asyncpg.connect(url)
    try:
        return await conn.fetch(sql, *args)
    finally:
        await conn.close()


async def until(check: Any, timeout: float = 3.0) -> float:
    """Seconds until the async predicate holds (fails after `timeout`)."""
    started = time.monotonic()
    await eventually_async(check, timeout, 0.01, what="the predicate")
    return time.monotonic() - started


async def play_dead(url: str, store: PostgresStore) -> None:
    """The process stops (its heartbeat task with it) and its last heartbeat is old."""
    assert store._control_task is not None
    store._control_task.cancel()
    await admin(
        url, "UPDATE owners SET heartbeat_at = now() - interval '1 minute' WHERE id = $1", store.lease_owner
    )


def test_a_dead_owners_streams_are_billed_and_its_leases_returned(postgres_url: str) -> None:
    async def main() -> None:
        async with stores(postgres_url, 3) as (dead, b, c):
            account_id, key_id = await account_and_key(b, "10", credit_limit="8")
            assert await dead.live_owners() >= 3
            now = now_ms()
            assert await dead.lease("account", account_id, Decimal(1), 1, now) == Decimal(10)
            assert await dead.lease("key", key_id, Decimal(1), 1, now) == Decimal(8)
            running = record(account_id, key_id, "0.4", status="incomplete")
            ended = record(account_id, key_id, "0.25")
            forgotten = record(account_id, key_id, "0.5")
            dead.note_progress(running, log_entry(running, status=499, error_code="api_error"))
            dead.note_progress(ended, log_entry(ended))
            dead.note_progress(forgotten, log_entry(forgotten))
            dead.forget_progress(forgotten.id)
            await dead.settle(ended, log_entry(ended))  # its own settlement: progress not applied

            async def progress_kept() -> bool:
                # Read on a connection of its own: the batch is handed over, its commit follows.
                rows = await admin(
                    postgres_url, "SELECT usage_id FROM stream_progress WHERE owner = $1", dead.lease_owner
                )
                return [row[0] for row in rows] == [running.id]

            await until(progress_kept)
            assert await b.reclaim_orphans() == 0  # alive: nothing to do
            await play_dead(postgres_url, dead)
            # Two reclaimers at once: the stream is billed once.
            assert sorted(await asyncio.gather(b.reclaim_orphans(), c.reclaim_orphans())) == [0, 1]
            assert await balance(b, account_id) == Decimal("9.35")
            assert await b.free("account", account_id, now) == Decimal("9.35")  # its leases are back
            assert await b.free("key", key_id, now) == Decimal("7.35")
            usage = await c.get_usage(running.id, key_id)
            assert usage is not None and usage.status == "incomplete" and usage.cost == Decimal("0.4")
            entry = await c.get_request_log(running.request_id)
            assert entry is not None and entry.status == 499 and entry.request_body is None
            assert await c.reclaim_orphans() == 0
            owners = await admin(postgres_url, "SELECT id FROM owners WHERE id = $1", dead.lease_owner)
            assert owners == []
            c._live = (0.0, 1)  # read afresh: the live ones count, the dead one no more
            assert await c.live_owners() == 2

    asyncio.run(main())


def test_a_progress_row_that_is_no_settlement_does_not_stop_the_reclaim(
    postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A dead process's progress that does not decode (written by hand, say) is logged and dropped;
    its leases come back and the other rows are billed, then and at every later reclaim."""

    async def main() -> None:
        async with stores(postgres_url, 2) as (dead, b):
            account_id, key_id = await account_and_key(b, "10")
            now = now_ms()
            assert await dead.lease("account", account_id, Decimal(1), 1, now) == Decimal(10)
            running = record(account_id, key_id, "0.4", status="incomplete")
            dead.note_progress(running, log_entry(running, status=499, error_code="api_error"))
            await until(lambda: _progress_of(postgres_url, dead.lease_owner, 1))
            await admin(
                postgres_url,
                "INSERT INTO stream_progress (owner, usage_id, settlement) VALUES ($1, 'u-bad', $2)",
                dead.lease_owner,
                b"\x96\x1e/1",
            )
            await play_dead(postgres_url, dead)
            assert await b.reclaim_orphans() == 1
            assert await balance(b, account_id) == Decimal("9.6")
            assert await b.free("account", account_id, now) == Decimal("9.6")
            assert await b.reclaim_orphans() == 0
            assert await _progress_of(postgres_url, dead.lease_owner, 0)

    with caplog.at_level(logging.ERROR, logger="gateway.store"):
        asyncio.run(main())
    assert any("progress that is not a settlement was dropped" in r.getMessage() for r in caplog.records)


async def _progress_of(url: str, owner: str, count: int) -> bool:
    found = await admin(url, "SELECT count(*) FROM stream_progress WHERE owner = $1", owner)
    return bool(found[0][0] == count)


DAY_MS = 86_400_000


def test_the_databases_periods_are_budgets(postgres_url: str) -> None:
    """gateway_period_start_ms (migrations/0002, counting key spend in a settlement) is
    gateway.budget.period_start_ms: around every boundary and at random moments, 1970 to 2100."""
    chosen = random.Random(14)
    moments = [chosen.randrange(0, 4_102_444_800_000) for _ in range(3000)]
    for start in (period_start_ms("monthly", m) for m in moments[:300]):
        moments += [start - 1, start, start + 1]
    resets: list[str | None] = [None, "daily", "weekly", "monthly"]
    pairs = [(reset, at) for reset in resets for at in moments]

    async def main() -> Any:
        async with stores(postgres_url, 1):  # migrated
            return await admin(
                postgres_url,
                "SELECT gateway_period_start_ms(r, t) FROM unnest($1::text[], $2::bigint[])"
                " WITH ORDINALITY AS x(r, t, i) ORDER BY i",
                [r for r, _ in pairs],
                [t for _, t in pairs],
            )

    found = asyncio.run(main())
    assert [row[0] for row in found] == [period_start_ms(r, t) for r, t in pairs]


def test_one_batch_across_periods_counts_as_one_by_one(postgres_url: str) -> None:
    """A batch (one statement) with charges from the key's period, an earlier and a later one, a
    duplicate and a free request: the key's spend, the balance and the leases as settling each in
    turn gives (gateway.budget's rule), every log entry kept once."""

    async def main() -> None:
        async with stores(postgres_url, 1) as (store,):
            account_id, key_id = await account_and_key(store, "10", credit_limit="8")
            await store.update_key(key_id, {"limit_reset": "daily"})
            now = now_ms()
            today = period_start_ms("daily", now)
            await admin(
                postgres_url,
                "UPDATE api_keys SET spent = 1, spent_period_ms = $1 WHERE id = $2",
                today,
                key_id,
            )
            assert await store.lease("account", account_id, Decimal(1), 1, now) == Decimal(10)
            assert await store.lease("key", key_id, Decimal(1), 1, now) == Decimal(7)
            at = today + DAY_MS // 2
            batch = [
                record(account_id, key_id, "0.5", ended_at_ms=at),
                record(account_id, key_id, "0.25", ended_at_ms=at - DAY_MS),  # late: counts today
                record(account_id, key_id, "0.125", ended_at_ms=at + DAY_MS),  # a new day: starts again
                record(account_id, key_id, "0.0625", ended_at_ms=at),  # late now: counts in the new day
                record(account_id, key_id, "0", ended_at_ms=at + DAY_MS),
                record(account_id, key_id, "0.03125", ended_at_ms=at + DAY_MS),
            ]
            batch.append(batch[2])  # the same settlement twice: recorded and charged once
            async with store._acquire() as conn:
                new = await rows.settle_many(
                    conn, [Settlement(r, log_entry(r)) for r in batch], store.lease_owner
                )
            assert new == 6
            charged = sum((r.cost for r in batch[:6]), Decimal(0))
            assert await balance(store, account_id) == Decimal(10) - charged
            key = await store.get_key(key_id)
            assert key is not None
            assert (key.spent, key.spent_period_ms) == (Decimal("0.21875"), today + DAY_MS)
            leases = await admin(
                postgres_url,
                "SELECT kind, amount FROM leases WHERE owner = $1 ORDER BY kind",
                store.lease_owner,
            )
            assert [(r[0], r[1]) for r in leases] == [
                ("account", Decimal(10) - charged),
                ("key", Decimal(7) - charged),
            ]
            logged = await admin(
                postgres_url,
                "SELECT count(*), count(DISTINCT id) FROM request_logs WHERE key_id = $1",
                key_id,
            )
            assert tuple(logged[0]) == (6, 6)
            async with store._acquire() as conn:  # again (a retried batch): nothing changes
                assert await rows.settle_many(conn, [Settlement(r, log_entry(r)) for r in batch], None) == 0
            assert await balance(store, account_id) == Decimal(10) - charged

    asyncio.run(main())


_LEASE = "INSERT INTO leases (kind, pot_id, owner, amount) VALUES ($1, $2, $3, $4)"
_PROGRESS = (
    "INSERT INTO stream_progress (owner, usage_id, settlement) VALUES ($1, $2, '{}') ON CONFLICT DO NOTHING"
)


async def _row(conn: asyncpg.Connection, sql: str, *args: Any) -> tuple[Any, ...]:
    row = await conn.fetchrow(sql, *args)
    assert row is not None
    return tuple(row)


async def _books(conn: asyncpg.Connection, owner: str, account_id: str, keys: tuple[str, str]) -> list[Any]:
    """An owner's books on one account and two keys: the balance, each key's spend and period, the
    owner's leases on the three pots, the usage records, log entries and streams' progress."""
    found = [await conn.fetchval("SELECT balance FROM accounts WHERE id = $1", account_id)]
    for key_id in keys:
        found.append(await _row(conn, "SELECT spent, spent_period_ms FROM api_keys WHERE id = $1", key_id))
    for kind, pot_id in [("account", account_id), ("key", keys[0]), ("key", keys[1])]:
        found.append(
            await conn.fetchval(
                "SELECT amount FROM leases WHERE kind = $1 AND pot_id = $2 AND owner = $3",
                kind,
                pot_id,
                owner,
            )
        )
    found.append(
        await _row(conn, "SELECT count(*), sum(cost) FROM usage_records WHERE account_id = $1", account_id)
    )
    found.append(await conn.fetchval("SELECT count(*) FROM request_logs WHERE account_id = $1", account_id))
    found.append(
        await _row(
            conn,
            "SELECT count(*), array_agg(settlement ORDER BY settlement) FROM stream_progress"
            " WHERE owner = $1",
            owner,
        )
    )
    return found


def test_one_settlement_takes_the_short_path_to_the_same_books(postgres_url: str) -> None:
    """migrations/0006: a batch of at most one settlement is settled by single-row statements. Two
    identical set-ups, one settled that way and one by the set-based path (gateway_settle_json_many),
    take the same 300 random batches (a settlement, sometimes with running streams' progress; a
    stream's progress alone; a log entry alone): charges and free requests, on a limited and an
    unlimited key, ending in the key's period, an earlier or a later one, repeats, streams whose
    progress ends, leases smaller and larger than a charge, none at all. After each, both
    statements answer the same and the books are the same."""

    async def main() -> None:
        async with stores(postgres_url, 1) as (store,):
            rng = random.Random(19)
            sides = []  # (function, owner, account, limited key, unlimited key)
            for function in ("gateway_settle_json", "gateway_settle_json_many"):
                account_id, limited = await account_and_key(store, "500", credit_limit="200")
                await store.update_key(limited, {"limit_reset": "daily"})
                unlimited = (await store.create_key(account_id, "k", os.urandom(32), "sk-test", None)).id
                sides.append((function, "owner-" + os.urandom(4).hex(), account_id, limited, unlimited))
            today = period_start_ms("daily", now_ms())
            done: list[list[Settlement]] = [[], []]
            conn = await asyncpg.connect(postgres_url)
            try:
                for step in range(300):
                    amounts = [rng.choice([None, "0.5", "2", "40"]) for _ in range(2)]
                    kind = rng.choices(["settle", "progress", "log"], [6, 2, 1])[0]
                    repeat = bool(done[0]) and rng.random() < 0.1
                    index = rng.randrange(len(done[0])) if repeat else 0
                    cost = rng.choice(["0", "0.125", "0.5", "1.375", "3"])
                    ended = today + rng.choice([-1, 0, 0, 0, 1, 2]) * DAY_MS + DAY_MS // 2
                    on_limited = rng.random() < 0.7
                    stream = rng.random() < 0.2  # the settlement ends a stream whose progress was kept
                    running = [os.urandom(6) for _ in range(rng.choice([0, 0, 1, 2]))]  # others' progress
                    answers, books = [], []
                    for side, (function, owner, account_id, limited, unlimited) in enumerate(sides):
                        if step % 25 == 0:  # leases of this step's sizes, or none
                            await conn.execute("DELETE FROM leases WHERE owner = $1", owner)
                            for pot, pot_id, amount in [
                                ("account", account_id, amounts[0]),
                                ("key", limited, amounts[1]),
                            ]:
                                if amount is not None:
                                    await conn.execute(_LEASE, pot, pot_id, owner, Decimal(amount))
                        if repeat:
                            settlement = done[side][index]
                        else:
                            r = record(
                                account_id, limited if on_limited else unlimited, cost, ended_at_ms=ended
                            )
                            settlement = Settlement(r, log_entry(r))
                            done[side].append(settlement)
                        usage_id = settlement.record.id
                        progress = {f"{usage_id}-{i}": data for i, data in enumerate(running)}
                        if kind == "progress":
                            args = rows.settle_args(
                                owner, progress={usage_id: running[0] if running else b"{}"}
                            )
                        elif kind == "log":
                            assert settlement.log is not None
                            args = rows.settle_args(owner, logs=[rows.log_values(settlement.log)])
                        else:
                            if stream:  # its progress was journaled: the settlement ends it
                                await conn.execute(_PROGRESS, owner, usage_id)
                            args = rows.settle_args(
                                owner,
                                progress=progress,
                                settlements=[settlement],
                                ended=[usage_id] if stream else [],
                            )
                        answers.append(await conn.fetchval(f"SELECT {function}($1::text, $2::jsonb)", *args))
                        books.append(await _books(conn, owner, account_id, (limited, unlimited)))
                    assert answers[0] == answers[1], step
                    assert books[0] == books[1], step
                assert books[0][0] < Decimal(500)  # money moved: the test saw charges
                assert books[0][-1][0] > 0  # streams' progress was kept
            finally:
                # The progress rows it made up are not settlements, and their owners never lived:
                # a later reclaim in the session's database would take them for a dead process's.
                owners = [owner for (_, owner, *_) in sides]
                await conn.execute("DELETE FROM stream_progress WHERE owner = ANY($1::text[])", owners)
                await conn.execute("DELETE FROM leases WHERE owner = ANY($1::text[])", owners)
                await conn.close()

    asyncio.run(main())


def test_key_changes_reach_other_instances_within_a_second(postgres_url: str) -> None:
    async def main() -> None:
        async with stores(postgres_url, 2) as (a, b):
            account = await a.create_account("acct-" + os.urandom(6).hex(), Decimal(1))
            secrets = [os.urandom(32) for _ in range(3)]
            keys = [await a.create_key(account.id, "k", s, "sk-a", None) for s in secrets]
            assert (await b.find_key(secrets[0])) is not None  # cached by b now
            assert await a.delete_key(keys[0].id)
            assert await until(lambda: _gone(b, secrets[0]), 1.0) < 1.0

            # Without the listener (its connection lost and not back), the poll still sees it.
            async def no_listener() -> None:
                return None

            b._open_control = no_listener  # type: ignore[method-assign]
            assert b._control is not None
            await admin(postgres_url, "SELECT pg_terminate_backend($1)", b._control.get_server_pid())

            async def noticed() -> bool:
                # The watch has dropped the lost listener (and stays without one: none opens), and
                # has a key_generation to compare with when it reads it through the pool.
                return b._control is None and b._keys.seen is not None

            await until(noticed)
            assert b._control is None
            assert (await b.find_key(secrets[1])) is not None
            await a.update_account(account.id, {"rpm_limit": 3})
            await asyncio.sleep(0)
            assert await until(lambda: _limited(b, secrets[1]), 2.5) < 2.5

    asyncio.run(main())


async def _gone(store: PostgresStore, secret: bytes) -> bool:
    return await store.find_key(secret) is None


async def _limited(store: PostgresStore, secret: bytes) -> bool:
    found = await store.find_key(secret)
    return found is not None and found.account.rpm_limit == 3


def test_instances_starting_together_migrate_once(postgres_url: str) -> None:
    name = "gateway_test_" + os.urandom(6).hex()
    url = urlsplit(postgres_url)._replace(path="/" + name).geturl()

    async def main() -> None:
        await admin(postgres_url, f"CREATE DATABASE {name}")
        try:
            opened = [PostgresStore(url, pool_size=2) for _ in range(4)]
            await asyncio.gather(*(store.start() for store in opened))
            for store in opened:
                await store.close()
            applied = await admin(url, "SELECT version, name FROM schema_migrations ORDER BY version")
            assert [(row[0], row[1]) for row in applied] == [(m.version, m.name) for m in migrations()]
        finally:
            await admin(postgres_url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    asyncio.run(main())


def test_broken_connections_are_replaced(postgres_url: str) -> None:
    async def main() -> None:
        async with stores(postgres_url, 1) as (store,):
            account_id, key_id = await account_and_key(store, "5")
            await admin(
                postgres_url,
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()",
            )
            # A call may meet a connection that died; the next ones get new connections.
            failures = 0
            for _ in range(5):
                try:
                    await store.get_account(account_id)
                    break
                except StoreUnavailable:
                    failures += 1
            assert failures < 5
            r = record(account_id, key_id, "1")
            await store.settle(r)  # the writer's connection is replaced too
            assert await balance(store, account_id) == Decimal(4)

    asyncio.run(main())


class Proxy:
    """A TCP relay to PostgreSQL that can be cut (every connection dropped, new ones refused) or
    made `silent` (connections kept and taken, nothing passed on: a database that hangs)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = 0
        self.server: asyncio.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()
        self.silent = False

    async def open(self) -> None:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", self.port)
        self.port = self.server.sockets[0].getsockname()[1]

    async def cut(self) -> None:
        assert self.server is not None
        self.server.close()
        for writer in list(self.writers):
            writer.transport.abort()
        await self.server.wait_closed()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self.writers |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    if self.silent:
                        continue
                    dst.write(data)
                    await dst.drain()
            except OSError:
                pass
            finally:
                dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self.writers -= {writer, up_writer}


def test_database_away_then_back(postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "SETTLE_WAIT_SECONDS", 0.5)
    parts = urlsplit(postgres_url)

    async def main() -> None:
        proxy = Proxy((parts.hostname or "127.0.0.1", parts.port or 5432))
        await proxy.open()
        url = parts._replace(netloc=f"{parts.username}@127.0.0.1:{proxy.port}").geturl()
        async with stores(url, 1) as (store,):
            account_id, key_id = await account_and_key(store, "10")
            await proxy.cut()
            r = record(account_id, key_id, "1.5")
            with pytest.raises(StoreUnavailable):
                await store.settle(r, log_entry(r))  # not committed: the request cannot succeed
            with pytest.raises(StoreUnavailable):
                await store.get_account(account_id)
            with pytest.raises(StoreUnavailable):
                await store.lease("account", account_id, Decimal(1), 1, 0)
            await proxy.open()  # the database is back: the queued charge commits, calls work
            direct = await asyncpg.connect(postgres_url)
            try:

                async def charged() -> bool:
                    value = await direct.fetchval("SELECT balance FROM accounts WHERE id = $1", account_id)
                    return bool(value == Decimal("8.5"))

                await until(charged, 5.0)
            finally:
                await direct.close()
            assert await store.get_usage(r.id, key_id) == r
            assert await balance(store, account_id) == Decimal("8.5")
        await proxy.cut()

    asyncio.run(main())


def test_ready_says_out_of_reach_within_its_second_when_the_database_hangs(postgres_url: str) -> None:
    """A database that takes connections and never answers: /ready's check says so within its
    second, every time, where the cancelled query was waited for again as its connection went back
    to the pool, 30 s (the statement timeout; outage review). One check runs at a time."""
    parts = urlsplit(postgres_url)

    async def main() -> None:
        proxy = Proxy((parts.hostname or "127.0.0.1", parts.port or 5432))
        await proxy.open()
        url = parts._replace(netloc=f"{parts.username}@127.0.0.1:{proxy.port}").geturl()
        async with stores(url, 1) as (store,):
            assert await store.ready() is None
            proxy.silent = True
            for _ in range(3):
                started = time.monotonic()
                reason = await store.ready()
                assert reason is not None and reason.startswith("PostgreSQL is out of reach"), reason
                assert time.monotonic() - started < 5, reason
            # Back, the queries lost meanwhile still unanswered (as a failover leaves them): the
            # next probe says so, not one stuck behind them (diff review: a minute).
            proxy.silent = False
            started = time.monotonic()
            assert await store.ready() is None
            assert time.monotonic() - started < 5
        await proxy.cut()

    asyncio.run(main())


def test_a_settlement_batch_keeps_every_value_exactly(postgres_url: str) -> None:
    """The batch travels as one JSON parameter (migrations/0004): text with quotes, backslashes,
    control characters and non-ASCII, absent values, every byte value in a body, costs with many
    decimals or an exponent, large whole numbers; each read back exactly as it was written."""

    async def main() -> None:
        async with stores(postgres_url, 1) as (store,):
            account_id, key_id = await account_and_key(store, "1000")
            odd = 'q"uo\\te \u0001\t\n é 中 😀 </script>'
            written = [
                record(
                    account_id, key_id, "0.000000138", model=odd, prompt_tokens=2**53, completion_tokens=0
                ),
                record(account_id, key_id, "1.38E-7", status="incomplete"),
                record(account_id, key_id, "123.4567"),
            ]
            entries = [
                log_entry(written[0], attempts=odd, request_body=bytes(range(256)), response_body=b""),
                log_entry(written[1], error_code="provider_error", request_body=None, response_body=None),
                log_entry(written[2], model=None, usage_id=None, cost=None),
            ]
            for r, entry in zip(written, entries, strict=True):
                await store.settle(r, entry)
            for r, entry in zip(written, entries, strict=True):
                assert await store.get_usage(r.id, key_id) == r
                assert await store.get_request_log(entry.id) == entry
            assert await balance(store, account_id) == Decimal("1000") - sum(r.cost for r in written)

    asyncio.run(main())

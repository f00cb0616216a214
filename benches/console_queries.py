"""The console's request log queries on a large log: log_stats over 24 hours, 7 days and 30 days,
and filtered pages of list_request_logs, on SQLite and on PostgreSQL.

Usage: python benches/console_queries.py [--rows 1000000] [--repeat 5] [--sqlite-only]
       [--url postgresql://postgres@127.0.0.1:5432/test]

Each store is fresh (SQLite in a temporary directory; PostgreSQL in a database made through `--url`,
dropped afterwards), migrated by the store itself, and filled directly with SQL: `--rows` request log
entries over 30 days (with a usage record for each success, as settlements write them) for four
accounts of 55 %, 25 %, 15 % and 5 % of the traffic, three keys each, six models, 95 % successes
(costs as the pricing rounds them: four significant figures, so few repeat), the rest 4xx, 5xx and
499, small bodies. PostgreSQL is vacuumed and analysed after the load, as autovacuum would. Every
figure is the best of `--repeat` runs, in milliseconds, of the store's own methods; "account" is the
busiest account (55 %: 550,000 entries in 30 days), "all" every account.

Measured on the development container (2 vCPUs shared with other work; SQLite 3.40, PostgreSQL 15),
1,000,000 entries, filled in 28 s (SQLite, every index in place) and 22 s (PostgreSQL):

                                              SQLite    PostgreSQL
    log_stats account 24 h / 1 h buckets        5.3 ms        6.3 ms
    log_stats account 7 d / 6 h buckets        32.2 ms       39.3 ms
    log_stats account 30 d / 1 d buckets      132.5 ms      163.0 ms
    log_stats all 30 d / 1 d buckets          214.4 ms      247.3 ms
    list account, newest page of 50             0.2 ms        0.5 ms
    list account + model                        0.5 ms        0.5 ms
    list account + 5xx                          2.2 ms        0.9 ms
    list account + last 24 h                   37.9 ms        0.5 ms
    list account + a day 10 days ago           36.5 ms      102.1 ms
    list account + key + 429                    5.3 ms        6.6 ms
    list account + 5xx in the last 7 d         65.5 ms        1.1 ms
    list account + a model never used         302.2 ms      359.0 ms
    list by usage id                            0.2 ms        0.4 ms

A list whose filters match nothing (or very little) without a time window reads the account's
whole log (the last row); a time window bounds that work by the window's size.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import random
import sqlite3
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

import asyncpg

from gateway.pricing import round_significant
from gateway.store import LogQuery, Store
from gateway.store.postgres import PostgresStore
from gateway.store.records import LOG_COLUMNS, USAGE_COLUMNS
from gateway.store.sqlite import SqliteStore

ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"
DAY = 86_400_000
HOUR = 3_600_000
SHARES = (0.55, 0.25, 0.15, 0.05)
# (model, path, $ per prompt token, $ per completion token)
MODELS = (
    ("openai/gpt-4o-mini", "/v1/chat/completions", Decimal("0.00000015"), Decimal("0.0000006")),
    ("openai/gpt-4.1", "/v1/responses", Decimal("0.000002"), Decimal("0.000008")),
    ("anthropic/claude-sonnet-4-5", "/v1/messages", Decimal("0.000003"), Decimal("0.000015")),
    ("meta/llama-3.1-8b", "/v1/chat/completions", Decimal("0.00000005"), Decimal("0.00000008")),
    ("openai/text-embedding-3-small", "/v1/embeddings", Decimal("0.00000002"), Decimal(0)),
    ("openai/gpt-image-1", "/v1/images/generations", Decimal("0.00001"), Decimal("0.00004")),
)
FAILURES = ((429, "rate_limited"), (400, "invalid_request"), (500, "upstream_error"), (502, "bad_gateway"))
Row = tuple[tuple[Any, ...], tuple[Any, ...] | None]


def entries(count: int, accounts: list[str], keys: dict[str, list[str]], now: int) -> Iterator[Row]:
    """(log entry, usage record or None) rows in LOG_COLUMNS and USAGE_COLUMNS order, oldest first,
    money as Decimal."""
    rng = random.Random(7)
    start = now - 30 * DAY
    times = sorted(rng.randrange(start, now) for _ in range(count))
    request_body, response_body = b'{"model": "m", "messages": []}' * 4, b'{"id": "x", "choices": []}' * 8
    for i, at in enumerate(times):
        account = rng.choices(accounts, SHARES)[0]
        key = rng.choice(keys[account])
        model, path, per_prompt, per_completion = rng.choice(MODELS)
        roll = rng.random()
        request_id = f"req_{i:024x}"
        if roll < 0.95:
            prompt, completion = rng.randrange(5, 4000), rng.randrange(1, 1500)
            cost: Decimal | None = round_significant(per_prompt * prompt + per_completion * completion)
            usage_id: str | None = f"chatcmpl-{i:024x}"
            status, code = 200, None
            usage: tuple[Any, ...] | None = (
                usage_id, request_id, key, account, model, "completed", prompt, completion, cost, at, at + 900,
            )  # fmt: skip
        else:
            cost, usage_id, usage = None, None, None
            status, code = (499, "client_closed") if roll > 0.995 else rng.choice(FAILURES)
        log = (
            request_id, key, account, "POST", path, model, status, code, at, 900, cost, usage_id,
            '[{"channel": "sim", "status": 200}]', request_body, len(request_body), response_body,
            len(response_body),
        )  # fmt: skip
        yield log, usage


async def make_accounts(store: Store) -> tuple[list[str], dict[str, list[str]]]:
    accounts, keys = [], {}
    for i in range(len(SHARES)):
        account = await store.create_account(f"bench-{i}", Decimal(1_000_000))
        accounts.append(account.id)
        keys[account.id] = [
            (await store.create_key(account.id, f"k{j}", os.urandom(32), "sk-bench", None)).id
            for j in range(3)
        ]
    return accounts, keys


def fill_sqlite(path: Path, rows: Iterator[Row]) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    logs = f"INSERT INTO request_logs ({', '.join(LOG_COLUMNS)}) VALUES ({', '.join('?' * len(LOG_COLUMNS))})"
    usages = f"INSERT INTO usage_records ({', '.join(USAGE_COLUMNS)}) VALUES ({', '.join('?' * len(USAGE_COLUMNS))})"
    cost = LOG_COLUMNS.index("cost")
    batch: list[tuple[Any, ...]] = []
    records: list[tuple[Any, ...]] = []
    conn.execute("BEGIN")
    for log, usage in rows:
        values = list(log)
        values[cost] = None if values[cost] is None else str(values[cost])
        batch.append(tuple(values))
        if usage is not None:
            records.append((*usage[:8], str(usage[8]), *usage[9:]))
        if len(batch) == 20_000:
            conn.executemany(logs, batch)
            conn.executemany(usages, records)
            batch, records = [], []
    conn.executemany(logs, batch)
    conn.executemany(usages, records)
    conn.execute("COMMIT")
    conn.close()


async def fill_postgres(url: str, rows: Iterator[Row]) -> None:
    conn = await asyncpg.connect(url)
    try:
        batch: list[tuple[Any, ...]] = []
        records: list[tuple[Any, ...]] = []
        for log, usage in rows:
            batch.append(log)
            if usage is not None:
                records.append(usage)
            if len(batch) == 50_000:
                await conn.copy_records_to_table("request_logs", records=batch, columns=LOG_COLUMNS)
                await conn.copy_records_to_table("usage_records", records=records, columns=USAGE_COLUMNS)
                batch, records = [], []
        await conn.copy_records_to_table("request_logs", records=batch, columns=LOG_COLUMNS)
        await conn.copy_records_to_table("usage_records", records=records, columns=USAGE_COLUMNS)
        await conn.execute("VACUUM ANALYZE request_logs")
        await conn.execute("VACUUM ANALYZE usage_records")
    finally:
        await conn.close()


async def best(repeat: int, run: Callable[[], Awaitable[Any]]) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        await run()
        times.append(time.perf_counter() - started)
    return min(times) * 1000


async def measure(
    store: Store, accounts: list[str], keys: dict[str, list[str]], now: int, repeat: int
) -> dict[str, float]:
    busiest = accounts[0]
    results: dict[str, float] = {}
    for name, account, span, bucket in (
        ("log_stats account 24 h / 1 h buckets", busiest, DAY, HOUR),
        ("log_stats account 7 d / 6 h buckets", busiest, 7 * DAY, 6 * HOUR),
        ("log_stats account 30 d / 1 d buckets", busiest, 30 * DAY, DAY),
        ("log_stats all 30 d / 1 d buckets", None, 30 * DAY, DAY),
    ):
        since = now - span
        results[name] = await best(
            repeat, functools.partial(store.log_stats, account, since, since + span, bucket)
        )

    def page(query: LogQuery | None) -> Callable[[], Awaitable[Any]]:
        return lambda: store.list_request_logs(
            account_id=busiest, key_id=None, before=None, limit=51, query=query
        )

    lists = (
        ("list account, newest page of 50", None),
        ("list account + model", LogQuery(model="openai/gpt-4.1")),
        ("list account + 5xx", LogQuery(status_class=5)),
        ("list account + last 24 h", LogQuery(since_ms=now - DAY)),
        ("list account + a day 10 days ago", LogQuery(since_ms=now - 10 * DAY, until_ms=now - 9 * DAY)),
        ("list account + key + 429", LogQuery(key_id=keys[busiest][1], status=429)),
        ("list account + 5xx in the last 7 d", LogQuery(status_class=5, since_ms=now - 7 * DAY)),
        # The worst case: nothing matches, so the account's whole log is read.
        ("list account + a model never used", LogQuery(model="none/such")),
    )
    for name, query in lists:
        assert bool(await page(query)()) == (query is None or query.model != "none/such"), name
        results[name] = await best(repeat, page(query))
    by_usage = LogQuery(request_id=f"chatcmpl-{0:024x}")
    results["list by usage id"] = await best(
        repeat,
        lambda: store.list_request_logs(account_id=None, key_id=None, before=None, limit=51, query=by_usage),
    )
    return results


async def run_sqlite(rows: int, repeat: int, now: int) -> tuple[float, dict[str, float]]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gateway.db"
        store = SqliteStore(path)
        await store.start()
        accounts, keys = await make_accounts(store)
        await store.close()
        started = time.perf_counter()
        fill_sqlite(path, entries(rows, accounts, keys, now))
        filled = time.perf_counter() - started
        store = SqliteStore(path)
        await store.start()
        try:
            return filled, await measure(store, accounts, keys, now, repeat)
        finally:
            await store.close()


async def run_postgres(url: str, rows: int, repeat: int, now: int) -> tuple[float, dict[str, float]]:
    name = "gw_console_" + os.urandom(4).hex()
    admin = await asyncpg.connect(url)
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        target = urlsplit(url)._replace(path="/" + name).geturl()
        store = PostgresStore(target, pool_size=4)
        await store.start()
        try:
            accounts, keys = await make_accounts(store)
            started = time.perf_counter()
            await fill_postgres(target, entries(rows, accounts, keys, now))
            filled = time.perf_counter() - started
            return filled, await measure(store, accounts, keys, now, repeat)
        finally:
            await store.close()
    finally:
        await admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", name)
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        await admin.close()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--url", default=ADMIN_URL)
    parser.add_argument("--sqlite-only", action="store_true")
    args = parser.parse_args()
    now = int(time.time() * 1000)
    filled, lite = await run_sqlite(args.rows, args.repeat, now)
    print(f"SQLite: {args.rows:,} entries filled in {filled:.1f} s ({args.rows / filled:,.0f}/s)", flush=True)
    pg: dict[str, float] = {}
    if not args.sqlite_only:
        filled, pg = await run_postgres(args.url, args.rows, args.repeat, now)
        print(f"PostgreSQL: {args.rows:,} entries filled in {filled:.1f} s ({args.rows / filled:,.0f}/s)")
    print(f"{'':42}{'SQLite':>10}{'PostgreSQL':>14}")
    for name, ms in lite.items():
        other = f"{pg[name]:11.1f} ms" if name in pg else ""
        print(f"{name:42}{ms:7.1f} ms{other:>14}")


if __name__ == "__main__":
    asyncio.run(main())

"""The PostgreSQL store's settlement on its own: p50 of `settle` at concurrency 1 and settles per
second at concurrency 64, each a charge + usage record + log entry handed to the database before it
returns (its commit follows: store/postgres/writer.py).

Usage: python benches/pg_settle.py [--seconds 5] [--url postgresql://postgres@127.0.0.1:5432/test]

Runs on a fresh database made through `--url` (dropped afterwards), one store (one process), one
account and one key with a credit limit, the process holding a lease on both as the gateway does.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from decimal import Decimal
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

import asyncpg

from gateway.clock import now_ms
from gateway.store import RequestLog, UsageRecord
from gateway.store.postgres import PostgresStore

ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"


def settlement(account_id: str, key_id: str) -> tuple[UsageRecord, RequestLog]:
    now = now_ms()
    usage_id = "chatcmpl-" + os.urandom(8).hex()
    request_id = "req_" + os.urandom(8).hex()
    record = UsageRecord(
        usage_id, request_id, key_id, account_id, "bench/chat", "completed", 12, 20,
        Decimal("0.0000138"), now - 2, now,
    )  # fmt: skip
    entry = RequestLog(
        request_id, key_id, account_id, "POST", "/v1/chat/completions", "bench/chat", 200, None,
        now - 2, 2, record.cost, usage_id, '[{"channel": "sim"}]', b'{"model": "bench/chat"}' * 4, 96,
        b'{"id": "chatcmpl"}' * 20, 360,
    )  # fmt: skip
    return record, entry


async def measure(url: str, seconds: float) -> dict[str, float]:
    store = PostgresStore(url, pool_size=10)
    await store.start()
    try:
        account = await store.create_account("bench-" + os.urandom(4).hex(), Decimal(1_000_000))
        key = await store.create_key(
            account.id, "bench", os.urandom(32), "sk-bench", None, credit_limit=Decimal(100_000)
        )
        await store.lease("account", account.id, Decimal(1), 1, now_ms())
        await store.lease("key", key.id, Decimal(1), 1, now_ms())
        for _ in range(200):  # warm up: connections, prepared statements
            await store.settle(*settlement(account.id, key.id))
        times: list[float] = []
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            record, entry = settlement(account.id, key.id)
            started = time.perf_counter()
            await store.settle(record, entry)
            times.append(time.perf_counter() - started)
        times.sort()
        done = 0

        async def client(until: float) -> None:
            nonlocal done
            while time.perf_counter() < until:
                await store.settle(*settlement(account.id, key.id))
                done += 1

        await asyncio.gather(*(client(time.perf_counter() + 1.0) for _ in range(64)))  # warm up
        done = 0
        started = time.perf_counter()
        await asyncio.gather(*(client(started + seconds) for _ in range(64)))
        rate = done / (time.perf_counter() - started)
        return {
            "c1_p50_ms": statistics.median(times) * 1000,
            "c1_p99_ms": times[int(len(times) * 0.99)] * 1000,
            "c64_settles_per_s": rate,
        }
    finally:
        await store.close()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--url", default=ADMIN_URL)
    args = parser.parse_args()
    name = "gw_settle_" + os.urandom(4).hex()
    admin = await asyncpg.connect(args.url)
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        result = await measure(urlsplit(args.url)._replace(path="/" + name).geturl(), args.seconds)
    finally:
        await admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", name)
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        await admin.close()
    print(
        f"settle c=1 p50 {result['c1_p50_ms']:.3f} ms, p99 {result['c1_p99_ms']:.3f} ms;"
        f" c=64 {result['c64_settles_per_s']:,.0f} settles/s"
    )


if __name__ == "__main__":
    asyncio.run(main())

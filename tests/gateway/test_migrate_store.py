"""`gateway admin migrate-store`: an embedded deployment's data moved into PostgreSQL, exactly.

The gateway runs on SQLite and serves requests; it is stopped; its data is moved into an empty
PostgreSQL database; a gateway on PostgreSQL then serves the same keys with the same balances, and
the old usage records and logs are there. A running source, or a target that is not empty, is
refused without changing anything.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import asyncpg
import httpx
import orjson
import pytest

from harness import chat_model, free_port, running, wait_until_listening

MODEL = "openai/gpt-4o-mini"


def migrate_store(source: Path | str, target: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "admin", "migrate-store", "--from", str(source), "--to", target],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def target_db(postgres_url: str) -> Iterator[str]:
    """An empty PostgreSQL database of its own, dropped afterwards."""
    name = "gw_move_" + os.urandom(4).hex()

    async def admin(sql: str) -> None:
        conn = await asyncpg.connect(postgres_url)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(admin(f"CREATE DATABASE {name}"))
    base = postgres_url.rsplit("/", 1)[0]
    yield f"{base}/{name}"
    asyncio.run(admin(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"))
    asyncio.run(admin(f"DROP DATABASE IF EXISTS {name}"))


def config(tmp: Path, name: str, sim_url: str, store: str, port: int) -> Path:
    path = tmp / f"{name}.toml"
    path.write_text(f"[server]\nport = {port}\n{store}\n" + chat_model(MODEL, "gpt-4o-mini", sim_url))
    return path


def pg_rows(url: str, sql: str) -> list[tuple[object, ...]]:
    async def go() -> list[tuple[object, ...]]:
        conn = await asyncpg.connect(url)
        try:
            return [tuple(r) for r in await conn.fetch(sql)]
        finally:
            await conn.close()

    return asyncio.run(go())


def test_an_embedded_deployment_moves_to_postgres_exactly(
    sim_url: str, tmp_path: Path, target_db: str, redis_url: str
) -> None:
    db = tmp_path / "gateway.db"
    port = free_port()
    lite = config(tmp_path, "lite", sim_url, f'[store]\npath = "{db}"', port)
    create = subprocess.run(
        [sys.executable, "-m", "gateway", "admin", "create-account", "--config", str(lite), "--name", "acme",
         "--balance", "5"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert create.stdout.startswith("acct_")
    made = subprocess.run(
        [sys.executable, "-m", "gateway", "admin", "create-key", "--config", str(lite), "--account", "acme",
         "--credit-limit", "3", "--limit-reset", "monthly"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    key = next(w for w in made.stdout.split() if w.startswith("sk-"))
    headers = {"authorization": f"Bearer {key}"}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "move me"}]}
    ids = []
    with (
        running(["serve", "--config", str(lite)], port),
        httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=30) as c,
    ):
        for _ in range(3):
            r = c.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            ids.append(r.json()["id"])
        # Refused while the gateway runs: its journal is live.
        busy = migrate_store(db, target_db)
        assert busy.returncode == 1 and "stop every gateway process" in busy.stderr
    with sqlite3.connect(db) as conn:
        (balance,) = conn.execute("SELECT balance FROM accounts WHERE name = 'acme'").fetchone()
        (charged,) = conn.execute("SELECT COUNT(*) FROM usage_records").fetchone()
        (logged,) = conn.execute("SELECT COUNT(*) FROM request_logs").fetchone()
    assert charged == 3 and Decimal(balance) < 5

    moved = migrate_store(lite, target_db)  # a config file names the source as well as a path
    assert moved.returncode == 0, moved.stderr
    report = orjson.loads(moved.stdout)
    assert report["rows"]["accounts"] == 1 and report["rows"]["usage_records"] == 3
    assert report["rows"]["request_logs"] == logged
    assert Decimal(report["balances"]) == Decimal(balance)
    assert pg_rows(target_db, "SELECT balance FROM accounts") == [(Decimal(balance),)]

    # Moving again into the now full database is refused, and changes nothing.
    again = migrate_store(db, target_db)
    assert again.returncode == 1 and "empty database only" in again.stderr
    assert pg_rows(target_db, "SELECT COUNT(*) FROM usage_records") == [(3,)]

    # A gateway on PostgreSQL serves the same key, balance and records.
    port2 = free_port()
    store = (
        f'[store]\nbackend = "postgres"\nurl = "{target_db}"\n'
        f'[redis]\nurl = "{redis_url}"\nprefix = "mv{port2}"'
    )
    pg = config(tmp_path, "pg", sim_url, store, port2)
    with running(["serve", "--config", str(pg)], port2) as proc:
        wait_until_listening(port2, proc)
        with httpx.Client(base_url=f"http://127.0.0.1:{port2}", headers=headers, timeout=30) as c:
            for rid in ids:
                assert c.get(f"/v1/usage/{rid}").status_code == 200
            r = c.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            cost = Decimal(r.headers["x-service-cost"])
    assert pg_rows(target_db, "SELECT balance FROM accounts") == [(Decimal(balance) - cost,)]

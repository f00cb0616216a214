"""`gateway admin migrate-store`: an embedded deployment's data moved into PostgreSQL, exactly.

The gateway runs on SQLite and serves requests; it is stopped; its data is moved into an empty
PostgreSQL database; a gateway on PostgreSQL then serves the same keys with the same balances, and
the old usage records and logs are there, and so are the console's users, conversations and messages
(not its sessions). A running source, or a target that is not empty, is refused without changing
anything.
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

from gateway.clock import now_ms
from gateway.store import ChatMessage, ConsoleSession, ConsoleUser, Conversation
from gateway.store.postgres import PostgresStore
from gateway.store.sqlite import SqliteStore
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


def account_through_the_cli(config_file: Path) -> None:
    """Account `a` holding 1, made by `gateway admin` (which makes the store when it is new)."""
    subprocess.run(
        [sys.executable, "-m", "gateway", "admin", "create-account", "--config", str(config_file),
         "--name", "a", "--balance", "1"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip


def pg_rows(url: str, sql: str) -> list[tuple[object, ...]]:
    async def go() -> list[tuple[object, ...]]:
        conn = await asyncpg.connect(url)
        try:
            return [tuple(r) for r in await conn.fetch(sql)]
        finally:
            await conn.close()

    return asyncio.run(go())


ConsoleRecords = tuple[ConsoleUser, Conversation, list[ChatMessage]]


async def add_console_records(db: Path) -> ConsoleRecords:
    """A member of acme with a password and a session, and a conversation of two messages."""
    store = SqliteStore(db)
    await store.start()
    try:
        account = await store.find_account("acme")
        assert account is not None
        user = await store.create_console_user(
            "Ann@Example.com", "member", account.id, os.urandom(32), 10**13
        )
        await store.set_console_password(user.id, "$argon2id$v=19$m=65536,t=3,p=4$x$y")
        now = now_ms()
        await store.create_console_session(
            ConsoleSession(os.urandom(32), user.id, "member", account.id, "csrf", now, now, now + 10**6)
        )
        conversation = Conversation("conv_" + os.urandom(12).hex(), account.id, user.id, "Move", now, now)
        await store.create_conversation(conversation)
        messages = [
            ChatMessage("msg_" + os.urandom(12).hex(), conversation.id, "user", "hi", None, None, None, None,
                        None, now + 1),
            ChatMessage("msg_" + os.urandom(12).hex(), conversation.id, "assistant", "hello", MODEL,
                        "req_" + os.urandom(8).hex(), 3, 4, Decimal("0.000001234"), now + 2),
        ]  # fmt: skip
        for message in messages:
            assert await store.add_chat_message(message, account.id)
        moved_user = await store.get_console_user(user.id)
        found = await store.get_conversation(conversation.id, account.id)
        assert moved_user is not None and found is not None
        return moved_user, found[0], found[1]
    finally:
        await store.close()


async def read_console_records(url: str, expected: ConsoleRecords) -> ConsoleRecords:
    """The same records, read through a PostgreSQL store."""
    user, conversation, _ = expected
    store = PostgresStore(url, pool_size=2)
    await store.start()
    try:
        moved = await store.find_console_user(user.email)
        found = await store.get_conversation(conversation.id, conversation.account_id)
        assert moved is not None and found is not None
        assert await store.list_console_users(user.account_id) == [moved]
        return moved, found[0], found[1]
    finally:
        await store.close()


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
        # A chat model's conversation the gateway keeps (routes/kept_responses.py) moves with it.
        r = c.post("/v1/responses", json={"model": MODEL, "input": "keep me"})
        assert r.status_code == 200, r.text
        kept = r.json()["id"]
        # Refused while the gateway runs: its journal is live.
        busy = migrate_store(db, target_db)
        assert busy.returncode == 1 and "stop every gateway process" in busy.stderr
    console = asyncio.run(add_console_records(db))
    with sqlite3.connect(db) as conn:
        (balance,) = conn.execute("SELECT balance FROM accounts WHERE name = 'acme'").fetchone()
        (charged,) = conn.execute("SELECT COUNT(*) FROM usage_records").fetchone()
        (logged,) = conn.execute("SELECT COUNT(*) FROM request_logs").fetchone()
    assert charged == 4 and Decimal(balance) < 5

    moved = migrate_store(lite, target_db)  # a config file names the source as well as a path
    assert moved.returncode == 0, moved.stderr
    report = orjson.loads(moved.stdout)
    assert report["rows"]["accounts"] == 1 and report["rows"]["usage_records"] == 4
    assert report["rows"]["kept_responses"] == 1
    assert report["rows"]["request_logs"] == logged
    assert Decimal(report["balances"]) == Decimal(balance)
    assert pg_rows(target_db, "SELECT balance FROM accounts") == [(Decimal(balance),)]
    # The console's users, conversations and messages moved (exact costs); its sessions did not.
    assert report["rows"]["console_users"] == 1 and report["rows"]["chat_messages"] == 2
    assert asyncio.run(read_console_records(target_db, console)) == console
    assert pg_rows(target_db, "SELECT COUNT(*) FROM console_sessions") == [(0,)]

    # Moving again into the now full database is refused, and changes nothing.
    again = migrate_store(db, target_db)
    assert again.returncode == 1 and "empty database only" in again.stderr
    assert pg_rows(target_db, "SELECT COUNT(*) FROM usage_records") == [(4,)]

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
            r = c.post("/v1/responses", json={"model": MODEL, "input": "next", "previous_response_id": kept})
            assert r.status_code == 200, r.text
            cost += Decimal(r.headers["x-service-cost"])
    assert pg_rows(target_db, "SELECT balance FROM accounts") == [(Decimal(balance) - cost,)]


def test_stores_that_cannot_be_opened_are_one_line_and_admin_files_are_private(
    sim_url: str, tmp_path: Path, postgres_url: str
) -> None:
    # `gateway admin` run first makes the store (and its directories) its user's alone, as serve does.
    lite = config(tmp_path, "lite", sim_url, '[store]\npath = "new/dir/gateway.db"', free_port())
    account_through_the_cli(lite)
    made = [tmp_path / "new", tmp_path / "new" / "dir", *(tmp_path / "new" / "dir").iterdir()]
    assert all(path.stat().st_mode & 0o077 == 0 for path in made), [oct(p.stat().st_mode) for p in made]
    # A PostgreSQL target that does not exist or cannot be reached: the reason, not a traceback.
    base = postgres_url.rsplit("/", 1)[0]
    for target in (f"{base}/gw_no_such_db", "postgresql://postgres@127.0.0.1:1/x"):
        moved = migrate_store(tmp_path / "new" / "dir" / "gateway.db", target)
        assert moved.returncode == 1 and moved.stderr.startswith("gateway: the store cannot be used: ")
        assert "Traceback" not in moved.stderr and len(moved.stderr.splitlines()) == 1


def test_a_config_file_is_read_for_its_store_alone_and_config_is_refused(
    sim_url: str, tmp_path: Path, target_db: str
) -> None:
    lite = config(tmp_path, "lite", sim_url, '[store]\npath = "gateway.db"', free_port())
    account_through_the_cli(lite)
    # The target's file as the instances will run it: its Redis named by a variable that is not
    # set where the copy runs (operator review: the copy stopped on it, and it never uses Redis).
    pg = config(
        tmp_path, "pg", sim_url,
        '[store]\nbackend = "postgres"\nurl_env = "GW_MOVE_TARGET"\n[redis]\nurl_env = "GW_MOVE_REDIS"',
        free_port(),
    )  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "GW_MOVE_REDIS"} | {"GW_MOVE_TARGET": target_db}
    command = [
        sys.executable,
        "-m",
        "gateway",
        "admin",
        "migrate-store",
        "--from",
        str(lite),
        "--to",
        str(pg),
    ]
    # --config, before the action or after it, is refused with the reason (it was ignored before the
    # action, and after it argparse printed the top-level usage).
    for refused in (
        [*command[:4], "--config", str(lite), *command[4:]],  # gateway admin --config X migrate-store
        [*command, "--config", str(lite)],
    ):
        done = subprocess.run(refused, capture_output=True, text=True, env=env, timeout=60, check=False)
        assert done.returncode == 1, done.stderr
        assert done.stderr == (
            "gateway: admin migrate-store: the stores are --from and --to (each a path or URL, or a"
            " config file naming it), not --config\n"
        )
    moved = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert moved.returncode == 0, moved.stderr
    assert orjson.loads(moved.stdout)["balances"] == "1"
    assert pg_rows(target_db, "SELECT name FROM accounts") == [("a",)]

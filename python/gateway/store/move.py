"""Moving an embedded deployment's data from SQLite to PostgreSQL (`gateway admin migrate-store`).

The gateway must be stopped: a live process's settlement journal would keep charging a database
that is no longer used. The source's journals are replayed first (what a killed process journaled
reaches the store) and process leases are returned, then every table is copied into an empty
PostgreSQL database in one transaction, row by row in the order the rows were made (so the
target's paging order is the source's). Columns are matched by name; each value is converted to the
target column's type (money from decimal text to numeric, never through a float). Afterwards every
balance, every key's spending, the sum of the usage records' costs and that of the console's chat
messages are compared: the move is committed only when they are equal to the last digit. The
console's users and conversations move; its sessions do not (their users sign in again).
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import asyncpg

from .postgres.migrate import migrate
from .sqlite import SqliteStore
from .sqlite.journal import live_count

# Source tables in the order their references need (accounts before keys, jobs before files,
# conversations before their messages). Console sessions stay behind: everyone signs in again.
TABLES = (
    "accounts",
    "console_users",
    "api_keys",
    "top_ups",
    "usage_records",
    "request_logs",
    "jobs",
    "leases",
    "idempotency",
    "response_states",
    "response_items",
    "kept_conversations",
    "kept_responses",
    "images",
    "video_files",
    "conversations",
    "chat_messages",
)


class MoveError(Exception):
    """The move cannot be done (source in use, target not empty, totals differ); nothing changed."""


@dataclass(frozen=True, slots=True)
class Moved:
    rows: dict[str, int]  # rows copied, by table
    balances: Decimal  # the sum of every account's balance, in both stores
    charged: Decimal  # the sum of every usage record's cost, in both stores


async def move_sqlite_to_postgres(source: Path, target_url: str) -> Moved:
    if not source.is_file():
        raise MoveError(f"{source}: no such SQLite database")
    journals = source.parent / (source.name + ".journal")
    if live_count(journals):
        raise MoveError(f"{source} is in use by a running gateway: stop every gateway process first")
    # Replays dead processes' journals and returns their leases; its own go back at close.
    store = SqliteStore(source)
    await store.start()
    await store.close()

    conn: asyncpg.Connection = await asyncpg.connect(target_url)
    try:
        await migrate(conn)
        with sqlite3.connect(source) as lite:
            async with conn.transaction():
                await _refuse_unless_empty(conn)
                rows = {table: await _copy(lite, conn, table) for table in TABLES}
                await conn.execute("UPDATE key_generation SET generation = generation + 1")
                moved = await _compare(lite, conn, rows)
    finally:
        await conn.close()
    return moved


async def _refuse_unless_empty(conn: asyncpg.Connection) -> None:
    for table in TABLES:
        if await conn.fetchval(f"SELECT EXISTS (SELECT 1 FROM {table})"):
            raise MoveError(f"the target database already has {table}: move into an empty database only")


async def _copy(lite: sqlite3.Connection, conn: asyncpg.Connection, table: str) -> int:
    source_columns = [row[1] for row in lite.execute(f"PRAGMA table_info({table})")]
    target_types = {
        name: kind
        for name, kind in await conn.fetch(
            "SELECT column_name, data_type FROM information_schema.columns"
            " WHERE table_schema = current_schema() AND table_name = $1 AND is_identity = 'NO'",
            table,
        )
    }
    columns = [c for c in source_columns if c in target_types]
    missing = sorted(set(target_types) - set(columns) - _DEFAULTED.get(table, set()))
    if missing:
        raise MoveError(f"{table}: the source has no {', '.join(missing)}")
    query = f"SELECT {', '.join(columns)} FROM {table}"
    if table == "leases":  # only what jobs hold: processes are stopped and theirs went back
        query += " WHERE owner LIKE 'job:%'"
    records = [
        tuple(_convert(value, target_types[column]) for column, value in zip(columns, row, strict=True))
        for row in lite.execute(query + " ORDER BY rowid")
    ]
    if records:
        await conn.copy_records_to_table(table, records=records, columns=columns)
    return len(records)


# Target columns the source may lack, which then take their defaults.
_DEFAULTED = {"top_ups": {"idempotency_key"}, "api_keys": {"spent", "spent_period_ms"}}


def _convert(value: Any, kind: str) -> Any:
    if value is None:
        return None
    if kind == "numeric":
        return Decimal(str(value))
    if kind == "ARRAY":  # allowed models: comma-separated names in SQLite
        return sorted(filter(None, str(value).split(",")))
    if kind == "bytea":
        return value.encode() if isinstance(value, str) else bytes(value)
    if kind in ("bigint", "integer", "smallint"):
        return int(value)
    if kind == "boolean":
        return bool(value)
    return value


async def _compare(lite: sqlite3.Connection, conn: asyncpg.Connection, rows: dict[str, int]) -> Moved:
    def money(values: Sequence[Any]) -> Decimal:
        return sum((Decimal(str(v)) for v in values if v is not None), Decimal(0))

    balances = money([b for (b,) in lite.execute("SELECT balance FROM accounts")])
    charged = money([c for (c,) in lite.execute("SELECT cost FROM usage_records")])
    spent = money([s for (s,) in lite.execute("SELECT spent FROM api_keys")])
    chats = money([c for (c,) in lite.execute("SELECT cost FROM chat_messages")])
    moved_balances = money([r[0] for r in await conn.fetch("SELECT balance FROM accounts")])
    moved_charged = money([r[0] for r in await conn.fetch("SELECT cost FROM usage_records")])
    moved_spent = money([r[0] for r in await conn.fetch("SELECT spent FROM api_keys")])
    moved_chats = money([r[0] for r in await conn.fetch("SELECT cost FROM chat_messages")])
    if (balances, charged, spent, chats) != (moved_balances, moved_charged, moved_spent, moved_chats):
        raise MoveError(
            f"totals differ after the copy (balances {balances} -> {moved_balances}, charges {charged}"
            f" -> {moved_charged}, key spending {spent} -> {moved_spent}, chat messages {chats}"
            f" -> {moved_chats}): nothing was committed"
        )
    return Moved(rows, balances, charged)


def run(source: Path, target_url: str) -> Moved:
    return asyncio.run(move_sqlite_to_postgres(source, target_url))

"""The SQLite store's group commit writes its rows many to a statement (rows.insert_rows): every
row goes in once, in order, whatever the batch's size against ROWS_PER_INSERT."""

from __future__ import annotations

import asyncio
import sqlite3
from decimal import Decimal
from pathlib import Path

import pytest

from gateway.store import RequestLog, Settlement, UsageRecord
from gateway.store.sqlite import SqliteStore
from gateway.store.sqlite.ledger import _settle_many
from gateway.store.sqlite.rows import ROWS_PER_INSERT, insert_rows


@pytest.mark.parametrize(
    "count", [0, 1, ROWS_PER_INSERT - 1, ROWS_PER_INSERT, ROWS_PER_INSERT + 1, 2 * ROWS_PER_INSERT + 5]
)
def test_rows_go_in_once_and_in_order(count: int) -> None:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.execute("CREATE TABLE t (seq INTEGER PRIMARY KEY AUTOINCREMENT, a TEXT, b INTEGER, c BLOB)")
    rows = [(f"row-{i}", i, None if i % 3 else bytes([i % 256])) for i in range(count)]
    insert_rows(conn, "INSERT INTO t (a, b, c)", rows)
    assert conn.execute("SELECT a, b, c FROM t ORDER BY seq").fetchall() == rows
    conn.close()


def _settlement(account_id: str, i: int) -> Settlement:
    record = UsageRecord(
        f"chatcmpl-{i}", f"req_{i}", "key_x", account_id, "m", "completed", 10, 5, Decimal("0.001"), 1, 2
    )
    log = RequestLog(
        f"req_{i}", "key_x", account_id, "POST", "/v1/chat/completions", "m", 200, None, 1, 1,
        Decimal("0.001"), record.id, None, b"{}", 2, b"{}", 2,
    )  # fmt: skip
    return Settlement(record, log)


def test_a_group_commit_of_many_settlements_applies_each_once(tmp_path: Path) -> None:
    """More settlements than one statement's rows, some repeated within the batch and some applied
    before: each usage record and log entry is written once and charged once."""
    db = tmp_path / "g.db"

    async def account() -> str:
        store = SqliteStore(db)
        await store.start()
        try:
            return (await store.create_account("a", Decimal(1))).id
        finally:
            await store.close()

    account_id = asyncio.run(account())
    conn = sqlite3.connect(db, isolation_level=None)
    count = 3 * ROWS_PER_INSERT + 7

    def apply(settlements: list[Settlement]) -> int:
        conn.execute("BEGIN IMMEDIATE")
        applied = _settle_many(conn, settlements, None)
        conn.execute("COMMIT")
        return applied

    assert apply([_settlement(account_id, i) for i in range(10)]) == 10
    batch = [_settlement(account_id, i) for i in range(count)] + [_settlement(account_id, 20)]
    assert apply(batch) == count - 10
    assert conn.execute("SELECT count(*) FROM usage_records").fetchone() == (count,)
    (balance,) = conn.execute("SELECT balance FROM accounts WHERE id = ?", (account_id,)).fetchone()
    assert Decimal(balance) == Decimal(1) - count * Decimal("0.001")
    logged = [row[0] for row in conn.execute("SELECT id FROM request_logs ORDER BY seq")]
    assert logged == [f"req_{i}" for i in range(count)]
    conn.close()

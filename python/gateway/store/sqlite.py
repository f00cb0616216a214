"""Embedded store: one SQLite file in WAL mode.

Reads are point lookups on the event loop's own connection (microseconds, no thread hop). Every write
goes to one writer thread per process, which takes whatever has queued up and commits it as one
transaction (group commit), each item in its own savepoint so that one failing item cannot undo the
others. Several worker processes share the file; BEGIN IMMEDIATE and busy_timeout serialise them.
Settlements do not wait for their commit: they are journaled first (see journal.py), so a response
never waits on the database, and a killed process loses no charge.
Money is stored as decimal text and added in Python's Decimal inside the write transaction.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar

from . import journal
from .base import USAGE_COLUMNS, Account, ApiKey, KeyContext, UsageRecord

T = TypeVar("T")
WriteOp = Callable[[sqlite3.Connection], Any]

# Each entry migrates the schema from version i to i + 1 (PRAGMA user_version). Append, never edit.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE accounts (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL UNIQUE,
        balance TEXT NOT NULL,
        allowed_models TEXT,
        created_at_ms INTEGER NOT NULL
    );
    CREATE TABLE api_keys (
        id TEXT PRIMARY KEY,
        account_id TEXT NOT NULL REFERENCES accounts(id),
        name TEXT NOT NULL,
        key_hash BLOB NOT NULL UNIQUE,
        prefix TEXT NOT NULL,
        created_at_ms INTEGER NOT NULL,
        expires_at_ms INTEGER,
        deleted_at_ms INTEGER
    );
    CREATE TABLE usage_records (
        id TEXT PRIMARY KEY,
        request_id TEXT NOT NULL,
        key_id TEXT NOT NULL,
        account_id TEXT NOT NULL,
        model TEXT NOT NULL,
        status TEXT NOT NULL,
        prompt_tokens INTEGER NOT NULL,
        completion_tokens INTEGER NOT NULL,
        cost TEXT NOT NULL,
        started_at_ms INTEGER NOT NULL,
        ended_at_ms INTEGER NOT NULL
    );
    CREATE INDEX usage_records_account ON usage_records(account_id, ended_at_ms);
    """,
)

_STOP = object()
_COLUMNS = ", ".join(USAGE_COLUMNS)
log = logging.getLogger("gateway.store")


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _new_id(prefix: str) -> str:
    return prefix + os.urandom(12).hex()


class SqliteStore:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._reader: sqlite3.Connection | None = None
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._writer: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._journal: journal.Journal | None = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._loop = asyncio.get_running_loop()
        writer_conn = self._connect(check_same_thread=False)
        self._migrate(writer_conn)
        self._replay_orphans(writer_conn)
        self._journal = journal.Journal(self.journal_dir)
        self._reader = self._connect(check_same_thread=True)
        self._writer = threading.Thread(
            target=self._write_loop, args=(writer_conn,), name="gateway-sqlite-writer", daemon=True
        )
        self._writer.start()

    @property
    def journal_dir(self) -> Path:
        return self.path.parent / (self.path.name + ".journal")

    def _replay_orphans(self, conn: sqlite3.Connection) -> None:
        """Apply what dead processes journaled but did not get into the store."""
        with journal.orphans(self.journal_dir) as records:
            if records:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    applied = sum(_settle(conn, r) for r in records)
                    conn.execute("COMMIT")
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                log.warning(
                    "replayed %d journaled settlements (%d new) of stopped processes", len(records), applied
                )

    async def close(self) -> None:
        if self._writer is not None:
            self._queue.put(_STOP)
            await asyncio.to_thread(self._writer.join)
            self._writer = None
        if self._journal is not None:
            self._journal.close()
            self._journal = None
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def _connect(self, *, check_same_thread: bool) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=check_same_thread, timeout=30.0
        )
        conn.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode: a commit survives a killed process (the WAL is in the OS), not a power cut.
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("PRAGMA busy_timeout=30000")
        return conn

    @staticmethod
    def _migrate(conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            (version,) = conn.execute("PRAGMA user_version").fetchone()
            for i in range(version, len(MIGRATIONS)):
                for statement in MIGRATIONS[i].split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute(f"PRAGMA user_version={i + 1}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    # ------------------------------------------------------------------ writer thread

    def _write_loop(self, conn: sqlite3.Connection) -> None:
        stop = False
        while not stop:
            batch = [self._queue.get()]
            while len(batch) < 512:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if _STOP in batch:
                stop = True
                batch = [item for item in batch if item is not _STOP]
            if batch:
                self._commit_batch(conn, batch)
        conn.close()

    def _commit_batch(self, conn: sqlite3.Connection, batch: list[tuple[WriteOp, Any, bool]]) -> None:
        outcomes: list[tuple[Any, bool, Any]] = []
        try:
            conn.execute("BEGIN IMMEDIATE")
            for op, future, _ in batch:
                conn.execute("SAVEPOINT item")
                try:
                    result = op(conn)
                except Exception as exc:  # one bad item fails alone; the batch goes on
                    conn.execute("ROLLBACK TO item")
                    outcomes.append((future, False, exc))
                else:
                    outcomes.append((future, True, result))
                conn.execute("RELEASE item")
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            outcomes = [(future, False, exc) for _, future, _ in batch]
        applied = 0
        retry = []
        for item, (_, ok, value) in zip(batch, outcomes, strict=True):
            if not item[2]:
                continue
            if ok:
                applied += 1
            else:
                # A journaled settlement is never dropped: it stays in the journal and is tried again.
                log.error("applying a settlement failed, will retry: %s", value, exc_info=value)
                retry.append(item)
        if applied and self._journal is not None:
            self._journal.applied(applied)
        if retry:
            time.sleep(0.1)
            for item in retry:
                self._queue.put(item)
        if self._loop is not None and any(f is not None for f, _, _ in outcomes):
            self._loop.call_soon_threadsafe(_resolve_all, outcomes)

    async def _write(self, op: WriteOp) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.put((op, future, False))
        return await future

    # ------------------------------------------------------------------ reads

    def _read(self) -> sqlite3.Connection:
        if self._reader is None:
            raise RuntimeError("store is not started")
        return self._reader

    async def find_key(self, key_hash: bytes) -> KeyContext | None:
        row = (
            self._read()
            .execute(
                "SELECT k.id, k.account_id, k.name, k.prefix, k.created_at_ms, k.expires_at_ms,"
                " a.name, a.balance, a.allowed_models"
                " FROM api_keys k JOIN accounts a ON a.id = k.account_id"
                " WHERE k.key_hash = ? AND k.deleted_at_ms IS NULL",
                (key_hash,),
            )
            .fetchone()
        )
        if row is None:
            return None
        key = ApiKey(
            id=row[0],
            account_id=row[1],
            name=row[2],
            prefix=row[3],
            created_at_ms=row[4],
            expires_at_ms=row[5],
        )
        account = Account(id=row[1], name=row[6], balance=Decimal(row[7]), allowed_models=_models(row[8]))
        return KeyContext(key=key, account=account)

    async def get_usage(self, usage_id: str, key_id: str) -> UsageRecord | None:
        row = (
            self._read()
            .execute(f"SELECT {_COLUMNS} FROM usage_records WHERE id = ? AND key_id = ?", (usage_id, key_id))
            .fetchone()
        )
        return None if row is None else UsageRecord.from_row(row)

    async def find_account(self, name: str) -> Account | None:
        row = (
            self._read()
            .execute("SELECT id, name, balance, allowed_models FROM accounts WHERE name = ?", (name,))
            .fetchone()
        )
        if row is None:
            return None
        return Account(id=row[0], name=row[1], balance=Decimal(row[2]), allowed_models=_models(row[3]))

    # ------------------------------------------------------------------ writes

    def settle(self, record: UsageRecord) -> None:
        if self._journal is None:
            raise RuntimeError("store is not started")
        self._journal.append(record)  # durable against a killed process from here on
        self._queue.put((lambda conn: _settle(conn, record), None, True))

    async def create_account(self, name: str, balance: Decimal) -> Account:
        account = Account(id=_new_id("acct_"), name=name, balance=balance)

        def op(conn: sqlite3.Connection) -> Account:
            conn.execute(
                "INSERT INTO accounts (id, name, balance, created_at_ms) VALUES (?, ?, ?, ?)",
                (account.id, name, str(balance), _now_ms()),
            )
            return account

        result: Account = await self._write(op)
        return result

    async def create_key(
        self, account_id: str, name: str, key_hash: bytes, prefix: str, expires_at_ms: int | None
    ) -> ApiKey:
        key = ApiKey(
            id=_new_id("key_"),
            account_id=account_id,
            name=name,
            prefix=prefix,
            created_at_ms=_now_ms(),
            expires_at_ms=expires_at_ms,
        )

        def op(conn: sqlite3.Connection) -> ApiKey:
            conn.execute(
                "INSERT INTO api_keys (id, account_id, name, key_hash, prefix, created_at_ms, expires_at_ms)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (key.id, account_id, name, key_hash, prefix, key.created_at_ms, expires_at_ms),
            )
            return key

        result: ApiKey = await self._write(op)
        return result

    async def delete_key(self, key_id: str) -> bool:
        def op(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                "UPDATE api_keys SET deleted_at_ms = ? WHERE id = ? AND deleted_at_ms IS NULL",
                (_now_ms(), key_id),
            )
            return cur.rowcount == 1

        result: bool = await self._write(op)
        return result


def _settle(conn: sqlite3.Connection, r: UsageRecord) -> bool:
    """Record and charge once: a settlement applied again (journal replay) changes nothing."""
    inserted = conn.execute(
        f"INSERT OR IGNORE INTO usage_records ({_COLUMNS}) VALUES ({', '.join('?' * len(USAGE_COLUMNS))})",
        r.as_row(),
    ).rowcount
    if inserted and not r.cost.is_zero():
        (balance,) = conn.execute("SELECT balance FROM accounts WHERE id = ?", (r.account_id,)).fetchone()
        conn.execute(
            "UPDATE accounts SET balance = ? WHERE id = ?", (str(Decimal(balance) - r.cost), r.account_id)
        )
    return inserted == 1


def _models(text: str | None) -> frozenset[str] | None:
    return frozenset(text.split(",")) if text else None


def _resolve_all(outcomes: list[tuple[Any, bool, Any]]) -> None:
    for future, ok, value in outcomes:
        if future is None or future.done():
            continue
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)

"""Embedded store: one SQLite file in WAL mode.

Reads are point lookups on the event loop's own connection (microseconds, no thread hop). Every write
goes to one writer thread per process, which takes whatever has queued up and commits it as one
transaction (group commit), each item in its own savepoint so that one failing item cannot undo the
others. Several worker processes share the file; BEGIN IMMEDIATE and busy_timeout serialise them.
Settlements do not wait for their commit: they are journaled first (see journal.py), so a response
never waits on the database, and a killed process loses no charge.
Money is stored as decimal text and added in Python's Decimal inside the write transaction.
Key lookups are cached per process behind a generation counter that every change to a key or an
account bumps, in a file every process sharing the database sees (see KeyCache).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from decimal import ROUND_DOWN, Decimal
from pathlib import Path
from typing import Any, TypeVar

import orjson

from ..budget import period_start_ms, spent_now
from ..clock import now_ms
from . import journal
from .base import (
    JOB_LEASE_PREFIX,
    JOB_RUNNING,
    LOG_COLUMNS,
    USAGE_COLUMNS,
    Account,
    AccountChanges,
    ApiKey,
    IdempotencyClaim,
    IdempotencyKeyReused,
    Job,
    KeyChanges,
    KeyContext,
    NameTaken,
    RequestLog,
    ResponseState,
    StoredAnswer,
    StoredImage,
    TopUp,
    UsageRecord,
)
from .key_cache import KeyCache

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
    # Image bytes live in the database, not in files, so any instance sharing it can serve them.
    """
    CREATE TABLE images (
        token TEXT PRIMARY KEY,
        key_id TEXT NOT NULL,
        content_type TEXT NOT NULL,
        expires_at_ms INTEGER NOT NULL,
        data BLOB NOT NULL
    );
    CREATE INDEX images_expiry ON images(expires_at_ms);
    """,
    """
    CREATE TABLE response_states (
        id TEXT PRIMARY KEY,
        account_id TEXT NOT NULL,
        model TEXT NOT NULL,
        channel_url TEXT NOT NULL,
        upstream_id TEXT NOT NULL,
        expires_at_ms INTEGER NOT NULL
    );
    CREATE INDEX response_states_expiry ON response_states(expires_at_ms);
    """,
    # Accounts, keys and money: a key's own credit limit (decimal text) and its reset period, an
    # account's rate limits, and the ledger of top-ups with the balance each one left.
    """
    ALTER TABLE api_keys ADD COLUMN credit_limit TEXT;
    ALTER TABLE api_keys ADD COLUMN limit_reset TEXT;
    ALTER TABLE accounts ADD COLUMN rpm_limit INTEGER;
    ALTER TABLE accounts ADD COLUMN tpm_limit INTEGER;
    CREATE INDEX api_keys_account ON api_keys(account_id);
    CREATE TABLE top_ups (
        id TEXT PRIMARY KEY,
        account_id TEXT NOT NULL REFERENCES accounts(id),
        amount TEXT NOT NULL,
        note TEXT,
        created_at_ms INTEGER NOT NULL,
        balance_after TEXT NOT NULL
    );
    CREATE INDEX top_ups_account ON top_ups(account_id);
    """,
    # What each key spent in its current credit-limit period (gateway.budget).
    """
    ALTER TABLE api_keys ADD COLUMN spent TEXT NOT NULL DEFAULT '0';
    ALTER TABLE api_keys ADD COLUMN spent_period_ms INTEGER NOT NULL DEFAULT 0;
    """,
    # Money each live process has set aside for its holds (gateway.funds): one row per process and
    # pot, the pot being an account's balance or a key's credit limit. Owner: the process's journal.
    """
    CREATE TABLE leases (
        kind TEXT NOT NULL,
        pot_id TEXT NOT NULL,
        owner TEXT NOT NULL,
        amount TEXT NOT NULL,
        PRIMARY KEY (kind, pot_id, owner)
    );
    CREATE INDEX leases_owner ON leases(owner);
    """,
    # Every model request, failures included (RequestLog); `seq` orders them for paging.
    """
    CREATE TABLE request_logs (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT NOT NULL UNIQUE,
        key_id TEXT,
        account_id TEXT,
        method TEXT NOT NULL,
        path TEXT NOT NULL,
        model TEXT,
        status INTEGER NOT NULL,
        error_code TEXT,
        started_at_ms INTEGER NOT NULL,
        duration_ms INTEGER NOT NULL,
        cost TEXT,
        usage_id TEXT,
        request_body BLOB,
        request_bytes INTEGER NOT NULL,
        response_body BLOB,
        response_bytes INTEGER NOT NULL
    );
    CREATE INDEX request_logs_account ON request_logs(account_id, seq);
    CREATE INDEX request_logs_key ON request_logs(key_id, seq);
    CREATE INDEX request_logs_started ON request_logs(started_at_ms);
    """,
    # A top-up sent again with the same Idempotency-Key adds nothing (docs/admin.md).
    """
    ALTER TABLE top_ups ADD COLUMN idempotency_key TEXT;
    CREATE UNIQUE INDEX top_ups_idempotency ON top_ups(account_id, idempotency_key)
        WHERE idempotency_key IS NOT NULL;
    """,
    # Idempotency-Key on the model endpoints that honour it (spec 8): per API key, the request
    # that holds the key (`running`, until its lease ends) or the answer kept for it (`done`).
    """
    CREATE TABLE idempotency (
        key_id TEXT NOT NULL,
        idempotency_key TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        state TEXT NOT NULL,
        lease_until_ms INTEGER NOT NULL,
        expires_at_ms INTEGER NOT NULL,
        status INTEGER,
        headers TEXT,
        body BLOB,
        PRIMARY KEY (key_id, idempotency_key)
    );
    CREATE INDEX idempotency_expiry ON idempotency(expires_at_ms);
    """,
    # The channels a request was tried on (gateway.routing), as a JSON array.
    """
    ALTER TABLE request_logs ADD COLUMN attempts TEXT;
    """,
    # Asynchronous video jobs (VideoJob) and, once completed, their files until they expire. The
    # poll lease keeps two processes from polling one job at once.
    """
    CREATE TABLE video_jobs (
        id TEXT PRIMARY KEY,
        key_id TEXT NOT NULL,
        account_id TEXT NOT NULL,
        request_id TEXT NOT NULL,
        model TEXT NOT NULL,
        channel TEXT NOT NULL,
        upstream_id TEXT NOT NULL,
        status TEXT NOT NULL,
        progress INTEGER NOT NULL,
        prompt TEXT NOT NULL,
        seconds TEXT NOT NULL,
        size TEXT,
        hold TEXT NOT NULL,
        created_at_ms INTEGER NOT NULL,
        completed_at_ms INTEGER,
        expires_at_ms INTEGER,
        error TEXT,
        cost TEXT,
        next_poll_at_ms INTEGER NOT NULL,
        lease_until_ms INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX video_jobs_key ON video_jobs(key_id, created_at_ms);
    CREATE INDEX video_jobs_due ON video_jobs(next_poll_at_ms) WHERE status IN ('queued', 'in_progress');
    CREATE TABLE video_files (
        job_id TEXT PRIMARY KEY,
        content_type TEXT NOT NULL,
        expires_at_ms INTEGER NOT NULL,
        data BLOB NOT NULL
    );
    """,
    # Video jobs become jobs of any kind (Job): videos, and background responses (deep research),
    # which keep their latest Response object. The poll lease and the hold work alike for both.
    """
    CREATE TABLE jobs (
        id TEXT PRIMARY KEY,
        kind TEXT NOT NULL,
        key_id TEXT NOT NULL,
        account_id TEXT NOT NULL,
        request_id TEXT NOT NULL,
        model TEXT NOT NULL,
        channel TEXT NOT NULL,
        upstream_id TEXT NOT NULL,
        status TEXT NOT NULL,
        progress INTEGER NOT NULL,
        hold TEXT NOT NULL,
        created_at_ms INTEGER NOT NULL,
        completed_at_ms INTEGER,
        expires_at_ms INTEGER,
        error TEXT,
        cost TEXT,
        prompt TEXT,
        seconds TEXT,
        size TEXT,
        body BLOB,
        previous_id TEXT,
        prompt_tokens INTEGER NOT NULL DEFAULT 0,
        next_poll_at_ms INTEGER NOT NULL,
        lease_until_ms INTEGER NOT NULL DEFAULT 0
    );
    INSERT INTO jobs (id, kind, key_id, account_id, request_id, model, channel, upstream_id, status,
        progress, hold, created_at_ms, completed_at_ms, expires_at_ms, error, cost, prompt, seconds,
        size, next_poll_at_ms, lease_until_ms)
    SELECT id, 'video', key_id, account_id, request_id, model, channel, upstream_id, status,
        progress, hold, created_at_ms, completed_at_ms, expires_at_ms, error, cost, prompt, seconds,
        size, next_poll_at_ms, lease_until_ms FROM video_jobs;
    DROP TABLE video_jobs;
    CREATE INDEX jobs_key ON jobs(key_id, kind, created_at_ms);
    CREATE INDEX jobs_due ON jobs(next_poll_at_ms) WHERE status IN ('queued', 'in_progress');
    """,
)

_STOP = object()


@dataclass(frozen=True, slots=True)
class _Op:
    """An operation someone awaits: committed at once, its outcome set on `future`."""

    run: WriteOp
    future: asyncio.Future[Any]


@dataclass(frozen=True, slots=True)
class _LogRow:
    """A request log entry's column values, written with the next group commit."""

    values: tuple[Any, ...]
    body_bytes: int  # counted in the backlog until written
    # Only the bodies of an entry written with its settlement (which journals the rest).
    bodies_only: bool = False


_COLUMNS = ", ".join(USAGE_COLUMNS)
# Row layouts read by _account, _key and _top_up.
_ACCOUNT_COLUMNS = ("id", "name", "balance", "allowed_models", "rpm_limit", "tpm_limit", "created_at_ms")
_KEY_COLUMNS = (
    "id",
    "account_id",
    "name",
    "prefix",
    "created_at_ms",
    "expires_at_ms",
    "credit_limit",
    "limit_reset",
    "deleted_at_ms",
    "spent",
    "spent_period_ms",
)
_TOP_UP_COLUMNS = ("id", "account_id", "amount", "note", "created_at_ms", "balance_after")
_ACCOUNT = ", ".join(_ACCOUNT_COLUMNS)
_KEY = ", ".join(_KEY_COLUMNS)
_TOP_UP = ", ".join(_TOP_UP_COLUMNS)
_FIND_KEY = (
    f"SELECT {', '.join('k.' + c for c in _KEY_COLUMNS)}, {', '.join('a.' + c for c in _ACCOUNT_COLUMNS)}"
    " FROM api_keys k JOIN accounts a ON a.id = k.account_id"
    " WHERE k.key_hash = ? AND k.deleted_at_ms IS NULL"
)
_LOG_COLUMNS = LOG_COLUMNS
_LOG = ", ".join(_LOG_COLUMNS)
# Job's fields in order.
_JOB_COLUMNS = (
    "id",
    "kind",
    "key_id",
    "account_id",
    "request_id",
    "model",
    "channel",
    "upstream_id",
    "status",
    "progress",
    "hold",
    "created_at_ms",
    "completed_at_ms",
    "expires_at_ms",
    "error",
    "cost",
    "prompt",
    "seconds",
    "size",
    "body",
    "previous_id",
    "prompt_tokens",
)
_JOB = ", ".join(_JOB_COLUMNS)
_HOLD, _COST = _JOB_COLUMNS.index("hold"), _JOB_COLUMNS.index("cost")
_RUNNING = f"status IN ({', '.join(repr(status) for status in JOB_RUNNING)})"
_LOG_HEAD = ", ".join(_LOG_COLUMNS[:13])  # every column up to the bodies
_INSERT_LOG = f"INSERT OR IGNORE INTO request_logs ({_LOG}) VALUES ({', '.join('?' * len(_LOG_COLUMNS))})"
log = logging.getLogger("gateway.store")
# How long the writer lets settlements gather before committing them (usage records appear this
# much later; charges are safe in the journal from the start).
SETTLEMENT_LINGER_SECONDS = 0.01
# Request log bodies waiting for the writer beyond this are not kept (their entries are).
MAX_LOG_BACKLOG_BYTES = 4 * 1024 * 1024
# Leases are granted in whole nano-dollars beyond what the hold needs.
_LEASE_QUANTUM = Decimal("0.000000001")


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
        self._keys = KeyCache(self.path.parent / (self.path.name + ".generation"))
        # Bytes of request log bodies queued and not yet written (see log_request).
        self._log_backlog = 0
        self._backlog_lock = threading.Lock()
        self._bodies_dropped = 0

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._loop = asyncio.get_running_loop()
        writer_conn = self._connect(check_same_thread=False)
        self._migrate(writer_conn)
        _reclaim(writer_conn, self.journal_dir)
        self._journal = journal.Journal(self.journal_dir)
        self._keys.open()
        self._reader = self._connect(check_same_thread=True)
        self._writer = threading.Thread(
            target=self._write_loop, args=(writer_conn,), name="gateway-sqlite-writer", daemon=True
        )
        self._writer.start()

    @property
    def journal_dir(self) -> Path:
        return self.path.parent / (self.path.name + ".journal")

    @property
    def lease_owner(self) -> str:
        if self._journal is None:
            raise RuntimeError("store is not started")
        return self._journal.owner

    async def reclaim_orphans(self) -> int:
        # Its own connection and transaction: a dead journal is deleted only after its commit.
        def reclaim() -> int:
            conn = self._connect(check_same_thread=True)
            try:
                return _reclaim(conn, self.journal_dir)
            finally:
                conn.close()

        return await asyncio.to_thread(reclaim)

    async def close(self) -> None:
        if self._writer is not None:
            if self._journal is not None:  # this process's leases go back with it
                owner = self._journal.owner
                await self._write(lambda conn: conn.execute("DELETE FROM leases WHERE owner = ?", (owner,)))
            self._queue.put(_STOP)
            await asyncio.to_thread(self._writer.join)
            self._writer = None
        if self._journal is not None:
            self._journal.close()
            self._journal = None
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        self._keys.close()

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
            # A journaled settlement is durable already and nobody awaits it: let more gather for a
            # moment so that one commit covers many, which keeps the writer's work (on the core the
            # event loop shares) off the request path. Anything awaited is committed at once.
            deadline = time.monotonic() + SETTLEMENT_LINGER_SECONDS
            while len(batch) < 512 and _nobody_waits(batch[-1]):
                wait = deadline - time.monotonic()
                try:
                    batch.append(self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait())
                except queue.Empty:
                    break
            if _STOP in batch:
                stop = True
                batch = [item for item in batch if item is not _STOP]
            if batch:
                self._commit_batch(conn, batch)
        conn.close()

    def _commit_batch(self, conn: sqlite3.Connection, batch: list[Any]) -> None:
        """One transaction for the whole batch: the settlements together (a handful of statements
        for any number of them, since every statement is a GIL hand-off with the event loop on the
        same core), the request log entries in one statement, then each awaited operation in its
        own savepoint (one failing fails alone). What was queued in the background is thus in place
        for every awaited operation of its batch."""
        settlements = [item for item in batch if isinstance(item, journal.Settlement)]
        ops = [item for item in batch if isinstance(item, _Op)]
        logs = [item for item in batch if isinstance(item, _LogRow)]
        outcomes: list[tuple[asyncio.Future[Any], bool, Any]] = []
        settled: Exception | None = None
        logged: Exception | None = None
        try:
            conn.execute("BEGIN IMMEDIATE")
            if settlements:
                settled = _in_savepoint(conn, lambda: _settle_many(conn, settlements, self._owner))
            if logs:
                logged = _in_savepoint(conn, lambda: _write_logs(conn, logs))
            for op in ops:
                outcomes.append((op.future, *_attempt(conn, op.run)))
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            outcomes = [(op.future, False, exc) for op in ops]
            settled = logged = exc
        if logs:
            with self._backlog_lock:
                self._log_backlog -= sum(row.body_bytes for row in logs)
        if logged is not None:  # nobody to tell: the entries are lost, the requests are not
            log.error("writing %d request log entries failed: %s", len(logs), logged, exc_info=logged)
        if settlements and settled is None and self._journal is not None:
            self._journal.applied(len(settlements))
        elif settlements:
            # A journaled settlement is never dropped: it stays in the journal and is tried again.
            log.error(
                "applying %d settlements failed, will retry: %s", len(settlements), settled, exc_info=settled
            )
            time.sleep(0.1)
            for settlement in settlements:
                self._queue.put(settlement)
        if self._loop is not None and outcomes:
            self._loop.call_soon_threadsafe(_resolve_all, outcomes)

    async def _write(self, op: WriteOp, *, changes_keys: bool = False) -> Any:
        """Run `op` in the writer's next transaction and return its result once committed. With
        `changes_keys`, every process's key cache is invalidated after the commit, even when the
        caller is cancelled meanwhile (the change commits regardless)."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if changes_keys:
            future.add_done_callback(self._keys_changed)
        self._queue.put(_Op(op, future))
        return await (asyncio.shield(future) if changes_keys else future)

    def _keys_changed(self, done: asyncio.Future[Any]) -> None:
        if not done.cancelled() and done.exception() is None:
            self._keys.changed()

    @property
    def _owner(self) -> str | None:
        return None if self._journal is None else self._journal.owner

    # ------------------------------------------------------------------ reads

    def _read(self) -> sqlite3.Connection:
        if self._reader is None:
            raise RuntimeError("store is not started")
        return self._reader

    async def find_key(self, key_hash: bytes) -> KeyContext | None:
        # The generation is read before the row: a change committed in between is seen next time.
        generation = self._keys.generation()
        ctx = self._keys.get(key_hash, generation)
        if ctx is not None:
            return ctx
        row = self._read().execute(_FIND_KEY, (key_hash,)).fetchone()
        if row is None:
            return None
        split = len(_KEY_COLUMNS)
        ctx = KeyContext(key=_key(row[:split]), account=_account(row[split:]))
        self._keys.put(key_hash, ctx, generation)
        return ctx

    async def get_usage(self, usage_id: str, key_id: str) -> UsageRecord | None:
        row = (
            self._read()
            .execute(f"SELECT {_COLUMNS} FROM usage_records WHERE id = ? AND key_id = ?", (usage_id, key_id))
            .fetchone()
        )
        return None if row is None else UsageRecord.from_row(row)

    async def list_request_logs(
        self, *, account_id: str | None, key_id: str | None, before: str | None, limit: int
    ) -> list[RequestLog]:
        where, args = [], []
        for column, value in (("account_id", account_id), ("key_id", key_id)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        if before is not None:
            where.append("seq < (SELECT seq FROM request_logs WHERE id = ?)")
            args.append(before)
        sql = f"SELECT {_LOG_HEAD}, NULL, request_bytes, NULL, response_bytes FROM request_logs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        rows = self._read().execute(sql + " ORDER BY seq DESC LIMIT ?", (*args, limit))
        return [_request_log(row) for row in rows]

    async def get_request_log(self, log_id: str) -> RequestLog | None:
        row = self._read().execute(f"SELECT {_LOG} FROM request_logs WHERE id = ?", (log_id,)).fetchone()
        return None if row is None else _request_log(row)

    async def get_image(self, token: str) -> StoredImage | None:
        row = (
            self._read()
            .execute(
                "SELECT token, data, content_type, expires_at_ms, key_id FROM images WHERE token = ?",
                (token,),
            )
            .fetchone()
        )
        return None if row is None else StoredImage(*row)

    async def find_response(self, response_id: str, account_id: str, now_ms: int) -> ResponseState | None:
        row = (
            self._read()
            .execute(
                "SELECT id, account_id, model, channel_url, upstream_id, expires_at_ms FROM response_states"
                " WHERE id = ? AND account_id = ? AND expires_at_ms > ?",
                (response_id, account_id, now_ms),
            )
            .fetchone()
        )
        return None if row is None else ResponseState(*row)

    async def find_account(self, name: str) -> Account | None:
        row = self._read().execute(f"SELECT {_ACCOUNT} FROM accounts WHERE name = ?", (name,)).fetchone()
        return None if row is None else _account(row)

    async def get_account(self, account_id: str) -> Account | None:
        row = self._read().execute(f"SELECT {_ACCOUNT} FROM accounts WHERE id = ?", (account_id,)).fetchone()
        return None if row is None else _account(row)

    async def list_accounts(self, *, after: str | None = None, limit: int | None = None) -> list[Account]:
        return [_account(row) for row in self._page("accounts", _ACCOUNT, None, after, limit)]

    async def list_top_ups(
        self, account_id: str, *, after: str | None = None, limit: int | None = None
    ) -> list[TopUp]:
        return [_top_up(row) for row in self._page("top_ups", _TOP_UP, account_id, after, limit)]

    def _page(
        self, table: str, columns: str, account_id: str | None, after: str | None, limit: int | None
    ) -> Any:
        """Rows in the order they were made, optionally of one account, from the one after the row
        with id `after`. `table` and `columns` are this module's constants, never a client's."""
        where, args = [], []
        if account_id is not None:
            where.append("account_id = ?")
            args.append(account_id)
        if after is not None:
            where.append(f"rowid > (SELECT rowid FROM {table} WHERE id = ?)")
            args.append(after)
        sql = f"SELECT {columns} FROM {table}" + (" WHERE " + " AND ".join(where) if where else "")
        sql += " ORDER BY rowid" + (" LIMIT ?" if limit is not None else "")
        return self._read().execute(sql, (*args, *(() if limit is None else (limit,))))

    async def get_key(self, key_id: str) -> ApiKey | None:
        row = self._read().execute(f"SELECT {_KEY} FROM api_keys WHERE id = ?", (key_id,)).fetchone()
        return None if row is None else _key(row)

    async def list_keys(
        self, account_id: str, *, after: str | None = None, limit: int | None = None
    ) -> list[ApiKey]:
        return [_key(row) for row in self._page("api_keys", _KEY, account_id, after, limit)]

    # ------------------------------------------------------------------ writes

    def settle(self, record: UsageRecord, entry: RequestLog | None = None) -> None:
        if self._journal is None:
            raise RuntimeError("store is not started")
        settlement = journal.Settlement(record, entry)
        self._journal.append(settlement)  # durable against a killed process from here on
        self._queue.put(settlement)
        if entry is not None and (entry.request_body is not None or entry.response_body is not None):
            # The bodies follow with the next group commit (they are not journaled).
            self._queue.put(self._log_row(entry, bodies_only=True))

    def note_progress(self, record: UsageRecord, entry: RequestLog) -> None:
        if self._journal is None:
            raise RuntimeError("store is not started")
        self._journal.progress(journal.Settlement(record, entry))

    def forget_progress(self, usage_id: str) -> None:
        if self._journal is not None:
            self._journal.forget(usage_id)

    def log_request(self, entry: RequestLog) -> None:
        self._queue.put(self._log_row(entry))

    def _log_row(self, entry: RequestLog, *, bodies_only: bool = False) -> _LogRow:
        bodies = len(entry.request_body or b"") + len(entry.response_body or b"")
        if self._log_backlog + bodies > MAX_LOG_BACKLOG_BYTES:
            # The writer is behind (the machine is saturated): keep the entry, not its bodies,
            # rather than let memory grow without bound.
            entry = replace(entry, request_body=None, response_body=None)
            bodies = 0
            self._bodies_dropped += 1
            if self._bodies_dropped in (1, 1000) or self._bodies_dropped % 100_000 == 0:
                log.warning(
                    "request log writes are behind: %d entries kept without bodies", self._bodies_dropped
                )
        with self._backlog_lock:
            self._log_backlog += bodies
        # Like a settlement, nobody waits for it: it joins the next group commit.
        return _LogRow(_log_values(entry), bodies, bodies_only)

    async def purge_log_bodies(self, before_ms: int) -> int:
        def op(conn: sqlite3.Connection) -> int:
            return conn.execute(
                "UPDATE request_logs SET request_body = NULL, response_body = NULL"
                " WHERE started_at_ms < ? AND (request_body IS NOT NULL OR response_body IS NOT NULL)",
                (before_ms,),
            ).rowcount

        purged: int = await self._write(op)
        return purged

    async def lease(self, kind: str, pot_id: str, need: Decimal, share: int, now_ms: int) -> Decimal:
        owner = self.lease_owner

        def op(conn: sqlite3.Connection) -> Decimal:
            free = _free(conn, kind, pot_id, now_ms)
            if free is None:  # the key has no limit (any more): only the account's balance counts
                return need
            if free < need:
                return Decimal(0)
            rest = free - need
            grant = need + (rest if share == 1 else (rest / share).quantize(_LEASE_QUANTUM, ROUND_DOWN))
            _add_to_lease(conn, kind, pot_id, owner, grant)
            return grant

        granted: Decimal = await self._write(op)
        return granted

    async def return_lease(self, kind: str, pot_id: str, amount: Decimal) -> None:
        owner = self.lease_owner
        await self._write(lambda conn: _add_to_lease(conn, kind, pot_id, owner, -amount))

    async def free(self, kind: str, pot_id: str, now_ms: int) -> Decimal | None:
        return _free(self._read(), kind, pot_id, now_ms)

    async def put_images(self, images: Sequence[StoredImage]) -> None:
        def op(conn: sqlite3.Connection) -> None:
            conn.executemany(
                "INSERT INTO images (token, key_id, content_type, expires_at_ms, data)"
                " VALUES (?, ?, ?, ?, ?)",
                [(i.token, i.key_id, i.content_type, i.expires_at_ms, i.data) for i in images],
            )

        await self._write(op)

    async def purge_images(self, now_ms: int) -> int:
        def op(conn: sqlite3.Connection) -> int:
            return conn.execute("DELETE FROM images WHERE expires_at_ms <= ?", (now_ms,)).rowcount

        deleted: int = await self._write(op)
        return deleted

    async def remember_response(self, state: ResponseState) -> None:
        def op(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT OR REPLACE INTO response_states"
                " (id, account_id, model, channel_url, upstream_id, expires_at_ms) VALUES (?, ?, ?, ?, ?, ?)",
                (
                    state.id,
                    state.account_id,
                    state.model,
                    state.channel_url,
                    state.upstream_id,
                    state.expires_at_ms,
                ),
            )

        await self._write(op)

    async def purge_responses(self, now_ms: int) -> int:
        def op(conn: sqlite3.Connection) -> int:
            return conn.execute("DELETE FROM response_states WHERE expires_at_ms <= ?", (now_ms,)).rowcount

        deleted: int = await self._write(op)
        return deleted

    async def create_job(self, job: Job, pots: Sequence[tuple[str, str]]) -> None:
        owner = self.lease_owner

        def op(conn: sqlite3.Connection) -> None:
            conn.execute(
                f"INSERT INTO jobs ({_JOB}, next_poll_at_ms)"
                f" VALUES ({', '.join('?' * len(_JOB_COLUMNS))}, ?)",
                (*_job_row(job), job.created_at_ms),
            )
            for kind, pot_id in pots:
                _add_to_lease(conn, kind, pot_id, owner, -job.hold)
                _add_to_lease(conn, kind, pot_id, JOB_LEASE_PREFIX + job.id, job.hold)

        await self._write(op)

    async def claim_jobs(self, now_ms: int, lease_ms: int, limit: int) -> list[Job]:
        due = (
            f"SELECT {_JOB} FROM jobs WHERE {_RUNNING}"
            " AND next_poll_at_ms <= ? AND lease_until_ms <= ? ORDER BY next_poll_at_ms LIMIT ?"
        )
        # Looked for first without the write lock: every worker asks every second, and a write
        # transaction each time would stall the request path's commits for nothing.
        if self._read().execute(due, (now_ms, now_ms, 1)).fetchone() is None:
            return []

        def op(conn: sqlite3.Connection) -> list[Job]:
            rows = conn.execute(due, (now_ms, now_ms, limit)).fetchall()
            conn.executemany(
                "UPDATE jobs SET lease_until_ms = ? WHERE id = ?",
                [(now_ms + lease_ms, row[0]) for row in rows],
            )
            return [_job(row) for row in rows]

        claimed: list[Job] = await self._write(op)
        return claimed

    async def note_job_progress(
        self, job_id: str, status: str, progress: int, next_poll_at_ms: int, body: bytes | None = None
    ) -> None:
        await self._write(
            lambda conn: conn.execute(
                "UPDATE jobs SET status = ?, progress = ?, next_poll_at_ms = ?, lease_until_ms = 0,"
                f" body = coalesce(?, body) WHERE id = ? AND {_RUNNING}",
                (status, progress, next_poll_at_ms, body, job_id),
            )
        )

    async def finish_job(
        self,
        job_id: str,
        status: str,
        *,
        error: str | None,
        record: UsageRecord | None,
        now_ms: int,
        body: bytes | None = None,
        content: bytes | None = None,
        content_type: str | None = None,
        ttl_ms: int = 0,
    ) -> bool:
        def op(conn: sqlite3.Connection) -> bool:
            ended = conn.execute(
                "UPDATE jobs SET status = ?, progress = ?, completed_at_ms = ?, expires_at_ms = ?,"
                f" error = ?, cost = ?, body = coalesce(?, body), lease_until_ms = 0"
                f" WHERE id = ? AND {_RUNNING}",
                (
                    status,
                    100 if status == "completed" else 0,
                    now_ms,
                    None if content is None else now_ms + ttl_ms,
                    error,
                    None if record is None else str(record.cost),
                    body,
                    job_id,
                ),
            ).rowcount
            if not ended:
                return False
            if record is not None:
                _settle_many(conn, [journal.Settlement(record)], None)
                # The request that created the job shows its charge in its log entry from now on.
                conn.execute(
                    "UPDATE request_logs SET cost = ?, usage_id = ? WHERE id = ?",
                    (str(record.cost), record.id, record.request_id),
                )
            if content is not None:
                conn.execute(
                    "INSERT OR REPLACE INTO video_files (job_id, content_type, expires_at_ms, data)"
                    " VALUES (?, ?, ?, ?)",
                    (job_id, content_type or "video/mp4", now_ms + ttl_ms, content),
                )
            conn.execute("DELETE FROM leases WHERE owner = ?", (JOB_LEASE_PREFIX + job_id,))
            return True

        done: bool = await self._write(op)
        return done

    async def get_job(self, job_id: str, key_id: str, kind: str) -> Job | None:
        row = (
            self._read()
            .execute(
                f"SELECT {_JOB} FROM jobs WHERE id = ? AND key_id = ? AND kind = ?", (job_id, key_id, kind)
            )
            .fetchone()
        )
        return None if row is None else _job(row)

    async def list_jobs(
        self, key_id: str, kind: str, *, after: str | None, limit: int, newest_first: bool
    ) -> list[Job]:
        order, beyond = ("DESC", "<") if newest_first else ("ASC", ">")
        where, args = "key_id = ? AND kind = ?", [key_id, kind]
        if after is not None:
            # Creation time, then id for jobs created in the same millisecond.
            where += (
                f" AND (created_at_ms, id) {beyond}"
                " (SELECT created_at_ms, id FROM jobs WHERE id = ? AND key_id = ?)"
            )
            args += [after, key_id]
        rows = self._read().execute(
            f"SELECT {_JOB} FROM jobs WHERE {where} ORDER BY created_at_ms {order}, id {order} LIMIT ?",
            (*args, limit),
        )
        return [_job(row) for row in rows]

    async def get_video_content(self, job_id: str, key_id: str, now_ms: int) -> tuple[bytes, str] | None:
        row = (
            self._read()
            .execute(
                "SELECT f.data, f.content_type FROM video_files f JOIN jobs j ON j.id = f.job_id"
                " WHERE f.job_id = ? AND j.key_id = ? AND f.expires_at_ms > ?",
                (job_id, key_id, now_ms),
            )
            .fetchone()
        )
        return None if row is None else (row[0], row[1])

    async def purge_video_files(self, now_ms: int) -> int:
        def op(conn: sqlite3.Connection) -> int:
            return conn.execute("DELETE FROM video_files WHERE expires_at_ms <= ?", (now_ms,)).rowcount

        purged: int = await self._write(op)
        return purged

    async def claim_idempotency(
        self, key_id: str, idempotency_key: str, fingerprint: str, now_ms: int, lease_ms: int, ttl_ms: int
    ) -> IdempotencyClaim:
        def op(conn: sqlite3.Connection) -> IdempotencyClaim:
            row = conn.execute(
                "SELECT fingerprint, state, lease_until_ms, expires_at_ms, status, headers, body"
                " FROM idempotency WHERE key_id = ? AND idempotency_key = ?",
                (key_id, idempotency_key),
            ).fetchone()
            if row is not None:
                kept, state, lease_until, expires_at, status, headers, body = row
                live = lease_until > now_ms if state == "running" else expires_at > now_ms
                if live and kept != fingerprint:
                    return IdempotencyClaim("reused")
                if live and state == "running":
                    return IdempotencyClaim("in_progress")
                if live:
                    pairs = tuple((str(k), str(v)) for k, v in orjson.loads(headers))
                    return IdempotencyClaim("replay", StoredAnswer(status, pairs, body))
            conn.execute(
                "INSERT OR REPLACE INTO idempotency (key_id, idempotency_key, fingerprint, state,"
                " lease_until_ms, expires_at_ms) VALUES (?, ?, ?, 'running', ?, ?)",
                (key_id, idempotency_key, fingerprint, now_ms + lease_ms, now_ms + ttl_ms),
            )
            return IdempotencyClaim("run")

        claim: IdempotencyClaim = await self._write(op)
        return claim

    async def finish_idempotency(
        self,
        key_id: str,
        idempotency_key: str,
        fingerprint: str,
        answer: StoredAnswer | None,
        now_ms: int,
        ttl_ms: int,
    ) -> None:
        mine = "key_id = ? AND idempotency_key = ? AND fingerprint = ? AND state = 'running'"
        where = (key_id, idempotency_key, fingerprint)

        def op(conn: sqlite3.Connection) -> None:
            if answer is None:
                conn.execute(f"DELETE FROM idempotency WHERE {mine}", where)
                return
            conn.execute(
                "UPDATE idempotency SET state = 'done', status = ?, headers = ?, body = ?, expires_at_ms = ?"
                f" WHERE {mine}",
                (answer.status, orjson.dumps(answer.headers), answer.body, now_ms + ttl_ms, *where),
            )

        await self._write(op)

    async def purge_idempotency(self, now_ms: int) -> int:
        def op(conn: sqlite3.Connection) -> int:
            return conn.execute("DELETE FROM idempotency WHERE expires_at_ms <= ?", (now_ms,)).rowcount

        deleted: int = await self._write(op)
        return deleted

    async def create_account(
        self,
        name: str,
        balance: Decimal,
        *,
        allowed_models: frozenset[str] | None = None,
        rpm_limit: int | None = None,
        tpm_limit: int | None = None,
    ) -> Account:
        account = Account(
            id=_new_id("acct_"),
            name=name,
            balance=balance,
            allowed_models=allowed_models,
            rpm_limit=rpm_limit,
            tpm_limit=tpm_limit,
            created_at_ms=now_ms(),
        )

        def op(conn: sqlite3.Connection) -> Account:
            with _unique_name(name):
                conn.execute(
                    f"INSERT INTO accounts ({_ACCOUNT}) VALUES ({', '.join('?' * len(_ACCOUNT_COLUMNS))})",
                    (
                        account.id,
                        name,
                        str(balance),
                        _models_text(allowed_models),
                        rpm_limit,
                        tpm_limit,
                        account.created_at_ms,
                    ),
                )
            return account

        result: Account = await self._write(op)
        return result

    async def update_account(self, account_id: str, changes: AccountChanges) -> Account | None:
        values: dict[str, Any] = dict(changes)
        if "allowed_models" in values:
            values["allowed_models"] = _models_text(values["allowed_models"])

        def op(conn: sqlite3.Connection) -> Account | None:
            if values:
                with _unique_name(changes.get("name", "")):
                    conn.execute(
                        f"UPDATE accounts SET {_assignments(values)} WHERE id = ?",
                        (*values.values(), account_id),
                    )
            row = conn.execute(f"SELECT {_ACCOUNT} FROM accounts WHERE id = ?", (account_id,)).fetchone()
            return None if row is None else _account(row)

        result: Account | None = await self._write(op, changes_keys=True)
        return result

    async def top_up(
        self, account_id: str, amount: Decimal, note: str | None, idempotency_key: str | None = None
    ) -> tuple[TopUp, bool] | None:
        # Read, add and write in the writer's transaction, as _settle does: every change to a balance
        # is serialised there (BEGIN IMMEDIATE across processes), so none is lost.
        def op(conn: sqlite3.Connection) -> tuple[TopUp, bool] | None:
            row = conn.execute("SELECT balance FROM accounts WHERE id = ?", (account_id,)).fetchone()
            if row is None:
                return None
            if idempotency_key is not None:
                earlier = conn.execute(
                    f"SELECT {_TOP_UP} FROM top_ups WHERE account_id = ? AND idempotency_key = ?",
                    (account_id, idempotency_key),
                ).fetchone()
                if earlier is not None:
                    entry = _top_up(earlier)
                    if (entry.amount, entry.note) != (amount, note):
                        raise IdempotencyKeyReused(idempotency_key)
                    return entry, True
            entry = TopUp(
                id=_new_id("topup_"),
                account_id=account_id,
                amount=amount,
                note=note,
                created_at_ms=now_ms(),
                balance_after=Decimal(row[0]) + amount,
            )
            conn.execute(
                "UPDATE accounts SET balance = ? WHERE id = ?", (str(entry.balance_after), account_id)
            )
            conn.execute(
                f"INSERT INTO top_ups ({_TOP_UP}, idempotency_key) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    entry.id,
                    account_id,
                    str(amount),
                    note,
                    entry.created_at_ms,
                    str(entry.balance_after),
                    idempotency_key,
                ),
            )
            return entry, False

        result: tuple[TopUp, bool] | None = await self._write(op)
        return result

    async def create_key(
        self,
        account_id: str,
        name: str,
        key_hash: bytes,
        prefix: str,
        expires_at_ms: int | None,
        *,
        credit_limit: Decimal | None = None,
        limit_reset: str | None = None,
    ) -> ApiKey:
        key = ApiKey(
            id=_new_id("key_"),
            account_id=account_id,
            name=name,
            prefix=prefix,
            created_at_ms=now_ms(),
            expires_at_ms=expires_at_ms,
            credit_limit=credit_limit,
            limit_reset=limit_reset,
        )

        def op(conn: sqlite3.Connection) -> ApiKey:
            conn.execute(
                "INSERT INTO api_keys (id, account_id, name, key_hash, prefix, created_at_ms, expires_at_ms,"
                " credit_limit, limit_reset) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    key.id,
                    account_id,
                    name,
                    key_hash,
                    prefix,
                    key.created_at_ms,
                    expires_at_ms,
                    _money_text(credit_limit),
                    limit_reset,
                ),
            )
            return key

        result: ApiKey = await self._write(op)
        return result

    async def update_key(self, key_id: str, changes: KeyChanges) -> ApiKey | None:
        values: dict[str, Any] = dict(changes)
        if "credit_limit" in values:
            values["credit_limit"] = _money_text(values["credit_limit"])

        def op(conn: sqlite3.Connection) -> ApiKey | None:
            if values:
                conn.execute(
                    f"UPDATE api_keys SET {_assignments(values)} WHERE id = ? AND deleted_at_ms IS NULL",
                    (*values.values(), key_id),
                )
            return _live_key(conn, key_id)

        result: ApiKey | None = await self._write(op, changes_keys=True)
        return result

    async def rotate_key(self, key_id: str, key_hash: bytes, prefix: str) -> ApiKey | None:
        def op(conn: sqlite3.Connection) -> ApiKey | None:
            conn.execute(
                "UPDATE api_keys SET key_hash = ?, prefix = ? WHERE id = ? AND deleted_at_ms IS NULL",
                (key_hash, prefix, key_id),
            )
            return _live_key(conn, key_id)

        result: ApiKey | None = await self._write(op, changes_keys=True)
        return result

    async def delete_key(self, key_id: str) -> bool:
        def op(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                "UPDATE api_keys SET deleted_at_ms = ? WHERE id = ? AND deleted_at_ms IS NULL",
                (now_ms(), key_id),
            )
            return cur.rowcount == 1

        result: bool = await self._write(op, changes_keys=True)
        return result


def _log_values(entry: RequestLog) -> tuple[Any, ...]:
    return (
        entry.id,
        entry.key_id,
        entry.account_id,
        entry.method,
        entry.path,
        entry.model,
        entry.status,
        entry.error_code,
        entry.started_at_ms,
        entry.duration_ms,
        None if entry.cost is None else str(entry.cost),
        entry.usage_id,
        entry.attempts,
        entry.request_body,
        entry.request_bytes,
        entry.response_body,
        entry.response_bytes,
    )


_BODIES = _LOG_COLUMNS.index("request_body"), _LOG_COLUMNS.index("response_body")


def _write_logs(conn: sqlite3.Connection, logs: Sequence[_LogRow]) -> None:
    conn.executemany(_INSERT_LOG, [row.values for row in logs if not row.bodies_only])
    conn.executemany(
        "UPDATE request_logs SET request_body = ?, response_body = ? WHERE id = ?",
        [(row.values[_BODIES[0]], row.values[_BODIES[1]], row.values[0]) for row in logs if row.bodies_only],
    )


def _settle_many(
    conn: sqlite3.Connection, settlements: Sequence[journal.Settlement], owner: str | None
) -> int:
    """Record and charge each settlement once, with its request log entry: one applied again
    (journal replay, a retried batch) changes nothing. Charges are summed per account, key and
    lease, so a batch costs a handful of statements. The charges come off the `owner` process's
    leases too: the money it had set aside is spent. Returns how many settlements were new."""
    if not settlements:
        return 0
    conn.executemany(_INSERT_LOG, [_log_values(s.log) for s in settlements if s.log is not None])
    records = [s.record for s in settlements]
    known: set[str] = set()
    for chunk in _chunks(list(dict.fromkeys(r.id for r in records))):
        marks = ", ".join("?" * len(chunk))
        known.update(
            row[0] for row in conn.execute(f"SELECT id FROM usage_records WHERE id IN ({marks})", chunk)
        )
    fresh: dict[str, UsageRecord] = {}
    for r in records:
        if r.id not in known and r.id not in fresh:
            fresh[r.id] = r
    conn.executemany(
        f"INSERT INTO usage_records ({_COLUMNS}) VALUES ({', '.join('?' * len(USAGE_COLUMNS))})",
        [r.as_row() for r in fresh.values()],
    )
    charged = [r for r in fresh.values() if not r.cost.is_zero()]
    per_account: dict[str, Decimal] = {}
    per_key: dict[str, Decimal] = {}
    for r in charged:
        per_account[r.account_id] = per_account.get(r.account_id, Decimal(0)) + r.cost
        per_key[r.key_id] = per_key.get(r.key_id, Decimal(0)) + r.cost
    for account_id, total in per_account.items():
        (balance,) = conn.execute("SELECT balance FROM accounts WHERE id = ?", (account_id,)).fetchone()
        conn.execute(
            "UPDATE accounts SET balance = ? WHERE id = ?", (str(Decimal(balance) - total), account_id)
        )
        if owner is not None:
            _add_to_lease(conn, "account", account_id, owner, -total)
    limited = _keys_with_limits(conn, list(per_key))
    for r in charged:
        if r.key_id in limited:
            _count_key_spend(conn, r)
    if owner is not None:
        for key_id in limited:
            _add_to_lease(conn, "key", key_id, owner, -per_key[key_id])
    return len(fresh)


def _keys_with_limits(conn: sqlite3.Connection, key_ids: list[str]) -> set[str]:
    limited: set[str] = set()
    for chunk in _chunks(key_ids):
        marks = ", ".join("?" * len(chunk))
        rows = conn.execute(
            f"SELECT id FROM api_keys WHERE id IN ({marks}) AND credit_limit IS NOT NULL", chunk
        )
        limited.update(row[0] for row in rows)
    return limited


def _chunks(values: list[str], size: int = 500) -> Iterator[list[str]]:
    """Lists short enough for one statement's parameters."""
    for i in range(0, len(values), size):
        yield values[i : i + size]


def _reclaim(conn: sqlite3.Connection, journal_dir: Path) -> int:
    """Apply what dead processes journaled but did not get into the store, and return their leases
    (and any lease whose owner has no journal left). Returns how many settlements were new."""
    with journal.orphans(journal_dir) as found:
        leased = _process_owners(conn)
        if not found and leased <= journal.owners(journal_dir):
            return 0
        conn.execute("BEGIN IMMEDIATE")
        try:
            applied = _settle_many(conn, [s for orphan in found for s in orphan.settlements], None)
            # Listed inside the transaction: a process that leases after this listing created its
            # journal before, as every lease waits for this transaction's lock.
            alive = journal.owners(journal_dir) - {orphan.owner for orphan in found}
            gone = [(owner,) for owner in _process_owners(conn) if owner not in alive]
            conn.executemany("DELETE FROM leases WHERE owner = ?", gone)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        records = sum(len(orphan.settlements) for orphan in found)
        if records or gone:
            log.warning(
                "replayed %d journaled settlements (%d new) and returned the leases of %d stopped processes",
                records,
                applied,
                len(gone),
            )
        return applied


def _process_owners(conn: sqlite3.Connection) -> set[str]:
    """The processes holding leases (jobs hold theirs until they end, whatever the process)."""
    owners = conn.execute("SELECT DISTINCT owner FROM leases")
    return {owner for (owner,) in owners if not owner.startswith(JOB_LEASE_PREFIX)}


def _free(conn: sqlite3.Connection, kind: str, pot_id: str, now_ms: int) -> Decimal | None:
    """What a pot holds that no process has leased: the account's balance, or what is left of the
    key's credit limit in the current period (None: the key has no limit)."""
    if kind == "account":
        row = conn.execute("SELECT balance FROM accounts WHERE id = ?", (pot_id,)).fetchone()
        total = Decimal(0) if row is None else Decimal(row[0])
    elif kind == "key":
        row = conn.execute(f"SELECT {_KEY} FROM api_keys WHERE id = ?", (pot_id,)).fetchone()
        if row is None:
            return Decimal(0)
        key = _key(row)
        if key.credit_limit is None:
            return None
        total = key.credit_limit - spent_now(key, now_ms)
    else:
        raise ValueError(f"unknown pot kind {kind!r}")
    leased = conn.execute("SELECT amount FROM leases WHERE kind = ? AND pot_id = ?", (kind, pot_id))
    return total - sum((Decimal(amount) for (amount,) in leased), Decimal(0))


def _add_to_lease(conn: sqlite3.Connection, kind: str, pot_id: str, owner: str, delta: Decimal) -> None:
    """Grow (or, with a negative delta, shrink) a process's lease; a lease never goes below zero,
    and an empty one is deleted."""
    where = (kind, pot_id, owner)
    row = conn.execute(
        "SELECT amount FROM leases WHERE kind = ? AND pot_id = ? AND owner = ?", where
    ).fetchone()
    amount = max(Decimal(0), (Decimal(row[0]) if row else Decimal(0)) + delta)
    if amount.is_zero():
        if row is not None:
            conn.execute("DELETE FROM leases WHERE kind = ? AND pot_id = ? AND owner = ?", where)
    elif row is None:
        conn.execute(
            "INSERT INTO leases (kind, pot_id, owner, amount) VALUES (?, ?, ?, ?)", (*where, str(amount))
        )
    else:
        conn.execute(
            "UPDATE leases SET amount = ? WHERE kind = ? AND pot_id = ? AND owner = ?", (str(amount), *where)
        )


def _nobody_waits(item: Any) -> bool:
    """True for a journaled settlement or a log entry (no future): its commit may wait for others."""
    return isinstance(item, journal.Settlement | _LogRow)


def _in_savepoint(conn: sqlite3.Connection, work: Callable[[], Any]) -> Exception | None:
    """Run `work` so that its failure undoes it alone; returns the failure."""
    ok, value = _attempt(conn, lambda _: work())
    return None if ok else value


def _attempt(conn: sqlite3.Connection, op: WriteOp) -> tuple[bool, Any]:
    conn.execute("SAVEPOINT item")
    try:
        result = op(conn)
    except Exception as exc:
        conn.execute("ROLLBACK TO item")
        conn.execute("RELEASE item")
        return False, exc
    conn.execute("RELEASE item")
    return True, result


def _count_key_spend(conn: sqlite3.Connection, r: UsageRecord) -> None:
    """Add the cost to what the key spent in the credit-limit period the request ended in. A cost
    from a period already over (a late journal replay) no longer counts against the limit. Only keys
    with a limit keep the count: the rest cost the writer one index lookup, not a row update."""
    row = conn.execute(
        "SELECT limit_reset, spent, spent_period_ms FROM api_keys WHERE id = ? AND credit_limit IS NOT NULL",
        (r.key_id,),
    ).fetchone()
    if row is None:
        return
    reset, spent, current = row
    period = period_start_ms(reset, r.ended_at_ms)
    if period < current:
        return
    total = (Decimal(spent) if period == current else Decimal(0)) + r.cost
    conn.execute(
        "UPDATE api_keys SET spent = ?, spent_period_ms = ? WHERE id = ?", (str(total), period, r.key_id)
    )


def _account(row: Sequence[Any]) -> Account:
    return Account(
        id=row[0],
        name=row[1],
        balance=Decimal(row[2]),
        allowed_models=_models(row[3]),
        rpm_limit=row[4],
        tpm_limit=row[5],
        created_at_ms=row[6],
    )


def _key(row: Sequence[Any]) -> ApiKey:
    return ApiKey(
        id=row[0],
        account_id=row[1],
        name=row[2],
        prefix=row[3],
        created_at_ms=row[4],
        expires_at_ms=row[5],
        credit_limit=None if row[6] is None else Decimal(row[6]),
        limit_reset=row[7],
        deleted_at_ms=row[8],
        spent=Decimal(row[9]),
        spent_period_ms=row[10],
    )


def _request_log(row: Sequence[Any]) -> RequestLog:
    # The columns are RequestLog's fields in order (_LOG_COLUMNS); only the cost needs converting.
    values = list(row)
    values[10] = None if values[10] is None else Decimal(values[10])
    return RequestLog(*values)


def _job_row(job: Job) -> tuple[Any, ...]:
    values = [getattr(job, column) for column in _JOB_COLUMNS]
    values[_HOLD] = str(job.hold)
    values[_COST] = None if job.cost is None else str(job.cost)
    return tuple(values)


def _job(row: Sequence[Any]) -> Job:
    # The columns are Job's fields in order (_JOB_COLUMNS); money is decimal text.
    values = list(row)
    values[_HOLD] = Decimal(values[_HOLD])
    values[_COST] = None if values[_COST] is None else Decimal(values[_COST])
    return Job(*values)


def _top_up(row: Sequence[Any]) -> TopUp:
    return TopUp(row[0], row[1], Decimal(row[2]), row[3], row[4], Decimal(row[5]))


def _live_key(conn: sqlite3.Connection, key_id: str) -> ApiKey | None:
    row = conn.execute(
        f"SELECT {_KEY} FROM api_keys WHERE id = ? AND deleted_at_ms IS NULL", (key_id,)
    ).fetchone()
    return None if row is None else _key(row)


def _assignments(values: dict[str, Any]) -> str:
    """`col = ?, ...` for an UPDATE. The names come from AccountChanges / KeyChanges, never a client."""
    return ", ".join(f"{column} = ?" for column in values)


@contextlib.contextmanager
def _unique_name(name: str) -> Iterator[None]:
    # The only constraint an account write can break is the unique name (ids are 96 random bits).
    try:
        yield
    except sqlite3.IntegrityError as exc:
        raise NameTaken(f"an account named {name!r} exists already") from exc


def _money_text(value: Decimal | None) -> str | None:
    return None if value is None else str(value)


# Allowed models as comma-separated names (a model name never holds a comma). NULL allows every model;
# the empty text is the empty set, which allows none.
def _models(text: str | None) -> frozenset[str] | None:
    return None if text is None else frozenset(filter(None, text.split(",")))


def _models_text(models: frozenset[str] | None) -> str | None:
    return None if models is None else ",".join(sorted(models))


def _resolve_all(outcomes: list[tuple[Any, bool, Any]]) -> None:
    for future, ok, value in outcomes:
        if future is None or future.done():
            continue
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)

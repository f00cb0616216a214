"""Embedded store: one SQLite file in WAL mode.

Reads are point lookups on the event loop's own connection (microseconds, no thread hop); the
console's reads that may go through many rows (filtered logs, statistics) run in a worker thread on
a connection of their own (console.py, which also keeps the console's records). Every write
goes to one writer thread per process (writer.py), which commits whatever has queued as one
transaction. Several worker processes share the file; BEGIN IMMEDIATE and busy_timeout serialise
them. Settlements do not wait for their commit: they are journaled first (journal.py), so a response
never waits on the database, and a killed process loses no charge. Money is stored as decimal text
and added in Python's Decimal inside the write transaction (ledger.py). Key lookups are cached per
process behind a generation counter that every change to a key or an account bumps, in a file every
process sharing the database sees (key_cache.py). The schema is schema.py; rows map to records in
rows.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson

from ...budget import period_start_ms
from ...clock import now_ms
from ...errors import ServiceUnavailable
from ...loop_failures import outcome_taken
from .. import leasing
from ..records import (
    JOB_LEASE_PREFIX,
    Account,
    AccountChanges,
    ApiKey,
    IdempotencyClaim,
    IdempotencyKeyReused,
    Job,
    KeptAnswer,
    KeptResponse,
    KeyChanges,
    KeyContext,
    NameTaken,
    RequestLog,
    ResponseState,
    Settlement,
    StoredAnswer,
    StoredImage,
    TopUp,
    UsageRecord,
    conversation_turns,
    new_account,
    new_id,
    new_key,
    opening_top_up,
)
from . import journal
from .console import Scans, SqliteConsole
from .files import JOURNAL, KEY_GENERATION, beside
from .key_cache import KeyCache
from .ledger import _add_to_lease, _free, _keep_answers, _reclaim, _settle_many
from .rows import (
    _ACCOUNT,
    _ACCOUNT_COLUMNS,
    _COLUMNS,
    _FIND_KEY,
    _JOB,
    _JOB_COLUMNS,
    _KEY,
    _KEY_COLUMNS,
    _LOG,
    _RUNNING,
    _TOP_UP,
    _account,
    _job,
    _job_row,
    _key,
    _models_text,
    _money_text,
    _request_log,
    _top_up,
    usage_record,
)
from .schema import MIGRATIONS, migrate
from .writer import WriteOp, Writer

log = logging.getLogger("gateway.store")
# How long /ready says the journal failed after its last failure (a full disk): no request may have
# tried it since, so the failure stands until a write succeeds or this much time has passed.
DISK_FAILURE_SECONDS = 30.0
DISK_AWAY = "store (its disk cannot be written)"
# SQLite's primary result codes of a disk that cannot take a write: full, failing, read-only.
_DISK_FAILURES = frozenset({sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_READONLY})
# How long a settlement that keeps an Idempotency-Key's answer waits for the commit that shows it
# to other processes (SqliteStore.settle).
ANSWER_VISIBLE_SECONDS = 1.0


class SqliteStore(SqliteConsole):
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._reader: sqlite3.Connection | None = None
        self._journal: journal.Journal | None = None
        # When the journal last failed to be written (a full disk), and why; None once it is again.
        self._disk_failed_at: float | None = None
        self._disk_error = ""
        self._writer = Writer(lambda: self._owner, self._applied)
        self._keys = KeyCache(beside(self.path, KEY_GENERATION))
        self._scans = Scans(lambda: self._connect(check_same_thread=False))

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        writer_conn = self._connect(check_same_thread=False)
        migrate(writer_conn)
        _reclaim(writer_conn, self.journal_dir)
        self._journal = journal.Journal(self.journal_dir)
        self._keys.open()
        self._reader = self._connect(check_same_thread=True)
        self._writer.start(writer_conn, asyncio.get_running_loop())

    @property
    def journal_dir(self) -> Path:
        return beside(self.path, JOURNAL)

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

    @property
    def lease_epoch(self) -> int:
        return 0  # a live process's journal lock cannot be taken: its leases are never reclaimed

    async def live_owners(self) -> int:
        # The processes sharing this database are the ones whose journal is locked (alive).
        return max(1, await asyncio.to_thread(journal.live_count, self.journal_dir))

    async def close(self) -> None:
        if self._writer.running:
            if self._journal is not None:  # this process's leases go back with it
                owner = self._journal.owner
                await self._write(lambda conn: conn.execute("DELETE FROM leases WHERE owner = ?", (owner,)))
            await self._writer.stop()
        if self._journal is not None:
            self._journal.close()
            self._journal = None
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        await asyncio.to_thread(self._scans.close)
        self._keys.close()

    def _connect(self, *, check_same_thread: bool) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=check_same_thread, timeout=BUSY_TIMEOUT_SECONDS
        )
        _write_ahead_log(conn)
        # NORMAL in WAL mode: a commit survives a killed process (the WAL is in the OS), not a power cut.
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA foreign_keys=ON")
        # The writer's savepoints (one a kind of item, gateway.store.sqlite.writer) keep the pages
        # they change in a sub-journal; past 64 KiB SQLite spills it to a temporary file, a pwrite(2)
        # a page on every group commit (more of the writer's system calls than the WAL's own). In
        # memory it is a copy. Temporary tables and sorts of the console's queries live there too.
        conn.execute("PRAGMA temp_store=MEMORY")
        conn.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_SECONDS * 1000)}")
        return conn

    # ------------------------------------------------------------------ writes, through the writer

    async def _write(self, op: WriteOp, *, changes_keys: bool = False) -> Any:
        """Run `op` in the writer's next transaction; with `changes_keys`, every process's key cache
        is invalidated after the commit, even when the caller is cancelled meanwhile."""
        try:
            return await self._writer.write(op, self._keys_changed if changes_keys else None)
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode & 0xFF not in _DISK_FAILURES:
                raise
            # A full, failing or read-only disk is the store away, as PostgreSQL's outage is: a
            # 503 that says so, not an unexpected 500 (review).
            self._disk_failed(exc)
            raise ServiceUnavailable(DISK_AWAY) from exc

    def _applied(self, count: int) -> None:
        if self._journal is not None:
            self._journal.applied(count)

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

    async def account_usages(self, account_id: str, usage_ids: Sequence[str]) -> list[UsageRecord]:
        wanted = list(dict.fromkeys(usage_ids))[:1000]
        if not wanted:
            return []
        marks = ", ".join("?" * len(wanted))
        found = (
            self._read()
            .execute(
                f"SELECT {_COLUMNS} FROM usage_records WHERE id IN ({marks}) AND account_id = ?",
                (*wanted, account_id),
            )
            .fetchall()
        )
        return [usage_record(row) for row in found]

    def follow_load(self, running: Callable[[], int]) -> None:
        self._writer.under_way = running  # it lingers longer while many requests run

    async def get_usage(self, usage_id: str, key_id: str) -> UsageRecord | None:
        row = (
            self._read()
            .execute(f"SELECT {_COLUMNS} FROM usage_records WHERE id = ? AND key_id = ?", (usage_id, key_id))
            .fetchone()
        )
        return None if row is None else usage_record(row)

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
                "SELECT id, account_id, model, channel_url, upstream_id, expires_at_ms, context_tokens"
                " FROM response_states WHERE id = ? AND account_id = ? AND expires_at_ms > ?",
                (response_id, account_id, now_ms),
            )
            .fetchone()
        )
        return None if row is None else ResponseState(*row)

    async def gateway_response_id(
        self, upstream_id: str, channel_url: str, account_id: str, now_ms: int
    ) -> str | None:
        row = (
            self._read()
            .execute(
                "SELECT id FROM response_states WHERE upstream_id = ? AND channel_url = ?"
                " AND account_id = ? AND expires_at_ms > ?",
                (upstream_id, channel_url, account_id, now_ms),
            )
            .fetchone()
        )
        return None if row is None else str(row[0])

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

    async def settle(
        self, record: UsageRecord, entry: RequestLog | None = None, answer: KeptAnswer | None = None
    ) -> None:
        # Durable once journaled (one write(2)); the store has it with the next group commit.
        if self._journal is None:
            raise RuntimeError("store is not started")
        settlement = Settlement(record, entry, answer)
        try:
            self._journal.append(settlement)  # durable against a killed process from here on
        except OSError as exc:
            # A full (or failing) disk: the charge is kept in memory and committed once the disk
            # has room, as PostgreSQL's queued settlements are (review: it was lost, and the client
            # got a 500); the request is told its charge is queued (503), not that nothing ran.
            self._writer.settle(settlement)
            self._disk_failed(exc)
            raise ServiceUnavailable(DISK_AWAY) from exc
        self._disk_failed_at = None
        # The log entry's bodies (not journaled) go into the store with it, in the same row.
        self._writer.settle(settlement)
        if answer is not None:
            # Durable, the answer its Idempotency-Key keeps is not yet where other processes look for
            # it: committed before the request answers (a few ms), else a retry another worker takes
            # at once would find the key still running (409 idempotency_key_in_progress, review).
            # Not waited on past ANSWER_VISIBLE_SECONDS: a store that is locked or failing must not
            # hold up an answer whose charge is durable; the others then see it once it commits.
            try:
                await asyncio.wait_for(
                    self._writer.write(_after_queued, on_commit=outcome_taken), ANSWER_VISIBLE_SECONDS
                )
            except Exception:  # TimeoutError, or the batch failed (it is retried)
                log.info("an idempotent answer is journaled; the store has it at its next commit")

    def note_progress(self, record: UsageRecord, entry: RequestLog) -> None:
        if self._journal is None:
            raise RuntimeError("store is not started")
        try:
            self._journal.progress(Settlement(record, entry))
        except OSError as exc:  # a full disk: the stream runs on, its settlement made at its end
            self._disk_failed(exc)

    def _disk_failed(self, exc: OSError | sqlite3.Error) -> None:
        """The journal or the database could not be written: said once an episode, and by /ready
        for a while."""
        if self._disk_failed_at is None:
            log.error("the store's disk cannot be written (%s): charges are kept in memory", exc)
        self._disk_failed_at, self._disk_error = time.monotonic(), str(exc)

    def forget_progress(self, usage_id: str) -> None:
        if self._journal is not None:
            self._journal.forget(usage_id)

    def log_request(self, entry: RequestLog) -> None:
        self._writer.log(entry)

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
            granted = leasing.grant(free, need, share)
            if granted:
                _add_to_lease(conn, kind, pot_id, owner, granted)
            return granted

        granted: Decimal = await self._write(op)
        return granted

    async def return_lease(self, kind: str, pot_id: str, amount: Decimal) -> None:
        owner = self.lease_owner
        await self._write(lambda conn: _add_to_lease(conn, kind, pot_id, owner, -amount))

    async def free(self, kind: str, pot_id: str, now_ms: int) -> Decimal | None:
        return _free(self._read(), kind, pot_id, now_ms)

    async def recall(self, kind: str, pot_id: str) -> Decimal:
        owner = self.lease_owner

        def op(conn: sqlite3.Connection) -> Decimal:
            others = [
                (other, Decimal(amount))
                for other, amount in conn.execute(
                    "SELECT owner, amount FROM leases WHERE kind = ? AND pot_id = ? AND owner <> ?",
                    (kind, pot_id, owner),
                )
                if not other.startswith(JOB_LEASE_PREFIX)  # a job's lease is all held
            ]
            conn.executemany(
                "UPDATE leases SET recalled = 1 WHERE kind = ? AND pot_id = ? AND owner = ?",
                [(kind, pot_id, other) for other, _ in others],
            )
            return sum((amount for _, amount in others), Decimal(0))

        leased: Decimal = await self._write(op)
        return leased

    async def recalls(self) -> list[tuple[str, str]]:
        rows = self._read().execute(
            "SELECT kind, pot_id FROM leases WHERE owner = ? AND recalled = 1", (self.lease_owner,)
        )
        return [(kind, pot_id) for kind, pot_id in rows]

    async def answer_recall(self, kind: str, pot_id: str, amount: Decimal) -> None:
        owner = self.lease_owner

        def op(conn: sqlite3.Connection) -> None:
            conn.execute(
                "UPDATE leases SET recalled = 0 WHERE kind = ? AND pot_id = ? AND owner = ?",
                (kind, pot_id, owner),
            )
            if amount > 0:
                _add_to_lease(conn, kind, pot_id, owner, -amount)

        await self._write(op)

    async def recall_pending(self, kind: str, pot_id: str) -> bool:
        row = (
            self._read()
            .execute(
                "SELECT 1 FROM leases WHERE kind = ? AND pot_id = ? AND recalled = 1 LIMIT 1", (kind, pot_id)
            )
            .fetchone()
        )
        return row is not None

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

    async def forget_response(self, response_id: str, account_id: str) -> bool:
        return await self._delete_owned("response_states", response_id, account_id)

    async def _delete_owned(self, table: str, row_id: str, account_id: str) -> bool:
        """Delete the row `row_id` of `table` if it is this account's; whether there was one."""

        def op(conn: sqlite3.Connection) -> bool:
            sql = f"DELETE FROM {table} WHERE id = ? AND account_id = ?"
            return bool(conn.execute(sql, (row_id, account_id)).rowcount)

        deleted: bool = await self._write(op)
        return deleted

    async def remember_response(self, state: ResponseState) -> None:
        def op(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT OR REPLACE INTO response_states"
                " (id, account_id, model, channel_url, upstream_id, expires_at_ms, context_tokens)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    state.id,
                    state.account_id,
                    state.model,
                    state.channel_url,
                    state.upstream_id,
                    state.expires_at_ms,
                    state.context_tokens,
                ),
            )
            _remember_items(conn, state.account_id, state.item_ids, state.expires_at_ms)

        await self._write(op)

    async def keep_response(
        self, kept: KeptResponse, expires_at_ms: int, touches: Sequence[str] = ()
    ) -> None:
        def op(conn: sqlite3.Connection) -> None:
            row = (
                None
                if kept.previous_id is None
                else conn.execute(
                    "SELECT conversation_id FROM kept_responses WHERE id = ?", (kept.previous_id,)
                ).fetchone()
            )
            conversation = kept.id if row is None else row[0]
            conn.execute(
                "INSERT INTO kept_responses"
                " (id, account_id, model, previous_id, conversation_id, items, body)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (kept.id, kept.account_id, kept.model, kept.previous_id, conversation, kept.items, kept.body),
            )
            conn.execute(
                "INSERT INTO kept_conversations (id, expires_at_ms) VALUES (?, ?) ON CONFLICT (id)"
                " DO UPDATE SET expires_at_ms = max(expires_at_ms, excluded.expires_at_ms)",
                (conversation, expires_at_ms),
            )
            for chunk in _chunks(touches):
                conn.execute(
                    "UPDATE kept_conversations SET expires_at_ms = max(expires_at_ms, ?) WHERE id IN"
                    f" (SELECT conversation_id FROM kept_responses WHERE id IN ({_marks(chunk)}))",
                    (expires_at_ms, *chunk),
                )

        await self._write(op)

    async def find_kept_response(self, response_id: str, account_id: str, now_ms: int) -> KeptResponse | None:
        row = (
            self._read()
            .execute(
                "SELECT r.id, r.account_id, r.model, r.previous_id, r.items, r.body FROM kept_responses r"
                " JOIN kept_conversations c ON c.id = r.conversation_id"
                " WHERE r.id = ? AND r.account_id = ? AND c.expires_at_ms > ?",
                (response_id, account_id, now_ms),
            )
            .fetchone()
        )
        return None if row is None else KeptResponse(*row)

    async def kept_conversation(
        self, response_id: str, account_id: str, now_ms: int, max_bytes: int
    ) -> list[bytes] | None:
        # Up to max_bytes (megabytes) read: in a thread of its own, on a connection of its own, so
        # that the event loop goes on serving meanwhile.
        return await asyncio.to_thread(self._kept_conversation, response_id, account_id, now_ms, max_bytes)

    def _kept_conversation(
        self, response_id: str, account_id: str, now_ms: int, max_bytes: int
    ) -> list[bytes] | None:
        with contextlib.closing(sqlite3.connect(self.path)) as conn:
            rows = conn.execute(
                "WITH RECURSIVE turn(id, previous_id, items, total, depth) AS ("
                " SELECT r.id, r.previous_id, r.items, length(r.items), 0 FROM kept_responses r"
                " JOIN kept_conversations c ON c.id = r.conversation_id"
                " WHERE r.id = ? AND r.account_id = ? AND c.expires_at_ms > ?"
                " UNION ALL SELECT k.id, k.previous_id, k.items, turn.total + length(k.items), turn.depth + 1"
                " FROM kept_responses k JOIN turn ON k.id = turn.previous_id"
                " WHERE k.account_id = ? AND turn.total <= ?)"
                " SELECT items, previous_id, total FROM turn ORDER BY depth DESC",
                (response_id, account_id, now_ms, account_id, max_bytes),
            ).fetchall()
        return conversation_turns(rows, max_bytes)

    async def delete_kept_response(self, response_id: str, account_id: str) -> bool:
        return await self._delete_owned("kept_responses", response_id, account_id)

    async def kept_items(self, response_ids: Sequence[str], account_id: str, now_ms: int) -> dict[str, bytes]:
        found: dict[str, bytes] = {}
        for chunk in _chunks(response_ids):
            rows = (
                self._read()
                .execute(
                    f"SELECT r.id, r.items FROM kept_responses r WHERE r.id IN ({_marks(chunk)})"
                    " AND r.account_id = ? AND (SELECT c.expires_at_ms FROM kept_conversations c"
                    " WHERE c.id = r.conversation_id) > ?",
                    (*chunk, account_id, now_ms),
                )
                .fetchall()
            )
            found.update(rows)
        return found

    async def remember_items(self, account_id: str, item_ids: Sequence[str], expires_at_ms: int) -> None:
        if item_ids:
            await self._write(lambda conn: _remember_items(conn, account_id, item_ids, expires_at_ms))

    async def known_items(self, account_id: str, item_ids: Sequence[str], now_ms: int) -> set[str]:
        known: set[str] = set()
        for chunk in _chunks(list(dict.fromkeys(item_ids))):
            rows = (
                self._read()
                .execute(
                    f"SELECT item_id FROM response_items WHERE item_id IN ({_marks(chunk)})"
                    " AND account_id = ? AND expires_at_ms > ?",
                    (*chunk, account_id, now_ms),
                )
                .fetchall()
            )
            known.update(row[0] for row in rows)
        return known

    async def purge_responses(self, now_ms: int) -> int:
        def op(conn: sqlite3.Connection) -> int:
            deleted: int = conn.execute(
                "DELETE FROM kept_responses WHERE conversation_id IN"
                " (SELECT id FROM kept_conversations WHERE expires_at_ms <= ?)",
                (now_ms,),
            ).rowcount
            conn.execute("DELETE FROM kept_conversations WHERE expires_at_ms <= ?", (now_ms,))
            deleted += conn.execute("DELETE FROM response_items WHERE expires_at_ms <= ?", (now_ms,)).rowcount
            return (
                deleted
                + conn.execute("DELETE FROM response_states WHERE expires_at_ms <= ?", (now_ms,)).rowcount
            )

        deleted: int = await self._write(op)
        return deleted

    async def create_job(
        self, job: Job, pots: Sequence[tuple[str, str]], answer: KeptAnswer | None = None
    ) -> None:
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
            if answer is not None:
                _keep_answers(conn, [answer])

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

    async def release_jobs(self, job_ids: Sequence[str]) -> None:
        def op(conn: sqlite3.Connection) -> None:
            for chunk in _chunks(list(job_ids)):
                conn.execute(
                    f"UPDATE jobs SET lease_until_ms = 0 WHERE id IN ({_marks(chunk)}) AND {_RUNNING}", chunk
                )

        if job_ids:
            await self._write(op)

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
                _settle_many(conn, [Settlement(record)], None)
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

    async def job_key(self, job_id: str, account_id: str, kind: str) -> str | None:
        row = (
            self._read()
            .execute(
                "SELECT key_id FROM jobs WHERE id = ? AND account_id = ? AND kind = ?",
                (job_id, account_id, kind),
            )
            .fetchone()
        )
        return None if row is None else str(row[0])

    async def job_counts(self) -> dict[tuple[str, str], int]:
        rows = self._read().execute("SELECT kind, status, count(*) FROM jobs GROUP BY kind, status")
        return {(kind, status): n for kind, status, n in rows}

    async def ready(self) -> str | None:
        try:
            (version,) = self._read().execute("PRAGMA user_version").fetchone()
        except (sqlite3.Error, RuntimeError) as exc:
            return f"the SQLite database cannot be read: {exc}"
        if version < len(MIGRATIONS):
            return f"the SQLite schema is at version {version}, the gateway needs {len(MIGRATIONS)}"
        failing = self._writer.failing
        if failing is not None:
            return f"writes to the SQLite database have failed for {failing:.0f} s: {self._writer.last_error}"
        if (
            self._disk_failed_at is not None
            and time.monotonic() - self._disk_failed_at < DISK_FAILURE_SECONDS
        ):
            return f"the store's disk cannot be written: {self._disk_error}"
        return None

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
        owner = self._owner

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
                " lease_until_ms, expires_at_ms, owner) VALUES (?, ?, ?, 'running', ?, ?, ?)",
                (key_id, idempotency_key, fingerprint, now_ms + lease_ms, now_ms + ttl_ms, owner),
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
        def op(conn: sqlite3.Connection) -> None:
            if answer is None:
                conn.execute(
                    "DELETE FROM idempotency WHERE key_id = ? AND idempotency_key = ?"
                    " AND fingerprint = ? AND state = 'running'",
                    (key_id, idempotency_key, fingerprint),
                )
                return
            kept = KeptAnswer(key_id, idempotency_key, fingerprint, answer, now_ms + ttl_ms)
            _keep_answers(conn, [kept])

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
        account = new_account(name, balance, allowed_models, rpm_limit, tpm_limit)

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
            if balance:
                opening = opening_top_up(account)
                conn.execute(
                    f"INSERT INTO top_ups ({_TOP_UP}) VALUES (?, ?, ?, ?, ?, ?)",
                    (
                        opening.id,
                        account.id,
                        str(opening.amount),
                        opening.note,
                        opening.created_at_ms,
                        str(opening.balance_after),
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
                id=new_id("topup_"),
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
        key = new_key(account_id, name, prefix, expires_at_ms, credit_limit, limit_reset)

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
                assignments, args = _assignments(values), list(values.values())
                if "limit_reset" in values:
                    # A new reset starts a fresh count, in the new reset's period (gateway.budget).
                    reset = values["limit_reset"]
                    assignments += (
                        ", spent = CASE WHEN limit_reset IS ? THEN spent ELSE '0' END"
                        ", spent_period_ms = CASE WHEN limit_reset IS ? THEN spent_period_ms ELSE ? END"
                    )
                    args += [reset, reset, period_start_ms(reset, now_ms())]
                changed = conn.execute(
                    f"UPDATE api_keys SET {assignments} WHERE id = ? AND deleted_at_ms IS NULL",
                    (*args, key_id),
                ).rowcount
                if changed and any(term in values for term in leasing.KEY_TERMS):
                    # What each process leased of the key's limit was granted under the old terms:
                    # every one gives back its spare at its next pass (Funds.answer_recalls), and
                    # leases again under the new ones.
                    conn.execute(
                        "UPDATE leases SET recalled = 1"
                        " WHERE kind = 'key' AND pot_id = ? AND owner NOT LIKE ?",
                        (key_id, JOB_LEASE_PREFIX + "%"),
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


# How long a connection waits for another process's lock: SQLite's busy timeout, and the wait to put
# a new file in WAL mode, which that timeout does not cover (_write_ahead_log).
BUSY_TIMEOUT_SECONDS = 30.0


def _write_ahead_log(conn: sqlite3.Connection) -> None:
    """Put the database in WAL mode (the file's own mode, kept once set). Setting it on a new file
    takes the file's exclusive lock, and SQLite does not wait for that lock through the busy
    timeout: while another process (a second worker starting at the same time) reads or migrates
    the file, it answers "database is locked" at once. So it is retried here, as the busy timeout
    would wait."""
    deadline = time.monotonic() + BUSY_TIMEOUT_SECONDS
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode != sqlite3.SQLITE_BUSY or time.monotonic() >= deadline:
                raise
        time.sleep(0.01)


# Ids a statement: SQLite limits a statement's parameters (32,766), a request may name more.
_CHUNK = 500


def _remember_items(
    conn: sqlite3.Connection, account_id: str, item_ids: Sequence[str], expires_at_ms: int
) -> None:
    conn.executemany(
        "INSERT INTO response_items (account_id, item_id, expires_at_ms) VALUES (?, ?, ?)"
        " ON CONFLICT (account_id, item_id)"
        " DO UPDATE SET expires_at_ms = max(expires_at_ms, excluded.expires_at_ms)",
        [(account_id, item_id, expires_at_ms) for item_id in dict.fromkeys(item_ids)],
    )


def _chunks(ids: Sequence[str]) -> Iterator[Sequence[str]]:
    for at in range(0, len(ids), _CHUNK):
        yield ids[at : at + _CHUNK]


def _marks(ids: Sequence[str]) -> str:
    return ", ".join("?" * len(ids))


def _after_queued(conn: sqlite3.Connection) -> None:
    """Nothing: awaited, it returns once what was queued before it is committed (one batch, FIFO)."""

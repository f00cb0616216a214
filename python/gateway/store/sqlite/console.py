"""The console's records on SQLite (the Console role of store/base.py), and the request log as the
console reads it: filtered lists and statistics (RequestLogs.list_request_logs with a LogQuery,
log_stats).

Writes go through the store's writer like every other write; point lookups are read on the event
loop's connection. What may read many rows (a filtered list, statistics) runs on a connection of its
own in a worker thread (Scans), so that it never holds up the event loop.

Statistics never read the table, whose rows hold the bodies: they read covering indexes by account
(or not) and model, then start time, holding the status and the cost as an exact integer of
picodollars (cost_pico, computed by SQLite from the decimal text: schema.py). For each model seen in
the period, each bucket is one range of one index, counted and summed by SQLite without sorting; the
few costs that have no picodollar integer (more than 12 decimal places) are read from their text and
added with Decimal. Money stays exact throughout: no float ever holds a cost.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any, TypeVar

from ..records import (
    ChatMessage,
    ConsoleSession,
    ConsoleUser,
    Conversation,
    LogBucket,
    LogQuery,
    LogStats,
    NameTaken,
    RequestLog,
    log_equalities,
    new_console_user,
)
from .rows import _LOG_HEAD, _money_text, _request_log

if TYPE_CHECKING:
    from .writer import WriteOp

T = TypeVar("T")

_USER_COLUMNS = tuple(f.name for f in dataclasses.fields(ConsoleUser))
_SESSION_COLUMNS = tuple(f.name for f in dataclasses.fields(ConsoleSession))
_CONVERSATION_COLUMNS = tuple(f.name for f in dataclasses.fields(Conversation))
_MESSAGE_COLUMNS = tuple(f.name for f in dataclasses.fields(ChatMessage))
_USER = ", ".join(_USER_COLUMNS)
_SESSION = ", ".join(_SESSION_COLUMNS)
_CONVERSATION = ", ".join(_CONVERSATION_COLUMNS)
_MESSAGE = ", ".join(_MESSAGE_COLUMNS)
_MESSAGE_COST = _MESSAGE_COLUMNS.index("cost")
_LIST_LOGS = f"SELECT {_LOG_HEAD}, NULL, request_bytes, NULL, response_bytes FROM request_logs"

# At most this many range queries (buckets times models) for one period's statistics; beyond, each
# model's buckets are grouped by SQLite in one query (which sorts the model's entries).
_MAX_RANGES = 4000


class Scans:
    """A read connection of its own, used in a worker thread one read at a time, for reads that may
    go through many rows."""

    def __init__(self, connect: Callable[[], sqlite3.Connection]) -> None:
        self._connect = connect
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    async def run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        return await asyncio.to_thread(self._run, work)

    def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        with self._lock:
            if self._conn is None:
                self._conn = self._connect()
            return work(self._conn)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


class SqliteConsole:
    """The Console role and the console's request log reads, for SqliteStore."""

    if TYPE_CHECKING:
        _scans: Scans

        def _read(self) -> sqlite3.Connection: ...

        async def _write(self, op: WriteOp, *, changes_keys: bool = False) -> Any: ...

    # ------------------------------------------------------------------ users

    async def create_console_user(
        self,
        email: str,
        role: str,
        account_id: str | None,
        invite_hash: bytes | None,
        invite_expires_at_ms: int | None,
    ) -> ConsoleUser:
        user = new_console_user(email, role, account_id, invite_hash, invite_expires_at_ms)

        def op(conn: sqlite3.Connection) -> None:
            try:
                conn.execute(
                    f"INSERT INTO console_users ({_USER}) VALUES ({_marks(len(_USER_COLUMNS))})",
                    dataclasses.astuple(user),
                )
            except sqlite3.IntegrityError as exc:
                if "console_users.email" in str(exc):
                    raise NameTaken(f"a console user with the email {user.email!r} exists already") from exc
                raise

        await self._write(op)
        return user

    async def get_console_user(self, user_id: str) -> ConsoleUser | None:
        return _user(self._read().execute(f"SELECT {_USER} FROM console_users WHERE id = ?", (user_id,)))

    async def find_console_user(self, email: str) -> ConsoleUser | None:
        return _user(
            self._read().execute(f"SELECT {_USER} FROM console_users WHERE email = ?", (email.lower(),))
        )

    async def find_console_invite(self, invite_hash: bytes, now_ms: int) -> ConsoleUser | None:
        return _user(
            self._read().execute(
                f"SELECT {_USER} FROM console_users WHERE invite_hash = ?"
                " AND (invite_expires_at_ms IS NULL OR invite_expires_at_ms > ?)",
                (invite_hash, now_ms),
            )
        )

    async def list_console_users(self, account_id: str | None = None) -> list[ConsoleUser]:
        sql, args = f"SELECT {_USER} FROM console_users", []
        if account_id is not None:
            sql, args = sql + " WHERE account_id = ?", [account_id]
        return [ConsoleUser(*row) for row in self._read().execute(sql + " ORDER BY rowid", args)]

    async def set_console_password(
        self, user_id: str, password_hash: str, invite: tuple[bytes, int] | None = None
    ) -> bool:
        def op(conn: sqlite3.Connection) -> bool:
            sql = (
                "UPDATE console_users SET password_hash = ?, invite_hash = NULL,"
                " invite_expires_at_ms = NULL WHERE id = ?"
            )
            args: tuple[object, ...] = (password_hash, user_id)
            if invite is not None:  # only while this invitation is open
                sql += " AND invite_hash = ? AND (invite_expires_at_ms IS NULL OR invite_expires_at_ms > ?)"
                args += invite
            if conn.execute(sql, args).rowcount != 1:
                return False
            conn.execute("DELETE FROM console_sessions WHERE user_id = ?", (user_id,))
            return True

        done: bool = await self._write(op)
        return done

    async def set_console_invite(self, user_id: str, invite_hash: bytes, expires_at_ms: int) -> bool:
        def op(conn: sqlite3.Connection) -> bool:
            changed = conn.execute(
                "UPDATE console_users SET password_hash = NULL, invite_hash = ?, invite_expires_at_ms = ?"
                " WHERE id = ?",
                (invite_hash, expires_at_ms, user_id),
            ).rowcount
            conn.execute("DELETE FROM console_sessions WHERE user_id = ?", (user_id,))
            return changed == 1

        done: bool = await self._write(op)
        return done

    async def delete_console_user(self, user_id: str) -> bool:
        def op(conn: sqlite3.Connection) -> bool:
            conn.execute("DELETE FROM console_sessions WHERE user_id = ?", (user_id,))
            return conn.execute("DELETE FROM console_users WHERE id = ?", (user_id,)).rowcount == 1

        done: bool = await self._write(op)
        return done

    # ------------------------------------------------------------------ sessions

    async def create_console_session(self, session: ConsoleSession) -> None:
        values = dataclasses.astuple(session)
        await self._write(
            lambda conn: conn.execute(
                f"INSERT INTO console_sessions ({_SESSION}) VALUES ({_marks(len(_SESSION_COLUMNS))})", values
            )
        )

    async def get_console_session(self, session_id: bytes) -> ConsoleSession | None:
        row = (
            self._read()
            .execute(f"SELECT {_SESSION} FROM console_sessions WHERE id = ?", (session_id,))
            .fetchone()
        )
        return None if row is None else ConsoleSession(*row)

    async def touch_console_session(self, session_id: bytes, seen_at_ms: int) -> None:
        await self._write(
            lambda conn: conn.execute(
                "UPDATE console_sessions SET seen_at_ms = max(seen_at_ms, ?) WHERE id = ?",
                (seen_at_ms, session_id),
            )
        )

    async def delete_console_session(self, session_id: bytes) -> None:
        await self._write(
            lambda conn: conn.execute("DELETE FROM console_sessions WHERE id = ?", (session_id,))
        )

    async def purge_console_sessions(self, now_ms: int, idle_ms: int) -> int:
        def op(conn: sqlite3.Connection) -> int:
            return conn.execute(
                "DELETE FROM console_sessions WHERE expires_at_ms <= ? OR seen_at_ms <= ?",
                (now_ms, now_ms - idle_ms),
            ).rowcount

        purged: int = await self._write(op)
        return purged

    # ------------------------------------------------------------------ conversations

    async def create_conversation(self, conversation: Conversation) -> None:
        values = dataclasses.astuple(conversation)
        await self._write(
            lambda conn: conn.execute(
                f"INSERT INTO conversations ({_CONVERSATION}) VALUES ({_marks(len(_CONVERSATION_COLUMNS))})",
                values,
            )
        )

    async def list_conversations(self, account_id: str) -> list[Conversation]:
        found = self._read().execute(
            f"SELECT {_CONVERSATION} FROM conversations WHERE account_id = ?"
            " ORDER BY updated_at_ms DESC, rowid DESC",
            (account_id,),
        )
        return [Conversation(*row) for row in found]

    async def get_conversation(
        self, conversation_id: str, account_id: str
    ) -> tuple[Conversation, list[ChatMessage]] | None:
        conn = self._read()
        row = conn.execute(
            f"SELECT {_CONVERSATION} FROM conversations WHERE id = ? AND account_id = ?",
            (conversation_id, account_id),
        ).fetchone()
        if row is None:
            return None
        messages = conn.execute(
            f"SELECT {_MESSAGE} FROM chat_messages WHERE conversation_id = ? ORDER BY seq", (conversation_id,)
        )
        return Conversation(*row), [_message(m) for m in messages]

    async def rename_conversation(self, conversation_id: str, account_id: str, title: str) -> bool:
        def op(conn: sqlite3.Connection) -> bool:
            return (
                conn.execute(
                    "UPDATE conversations SET title = ? WHERE id = ? AND account_id = ?",
                    (title, conversation_id, account_id),
                ).rowcount
                == 1
            )

        done: bool = await self._write(op)
        return done

    async def delete_conversation(self, conversation_id: str, account_id: str) -> bool:
        def op(conn: sqlite3.Connection) -> bool:
            # Its messages go with it (ON DELETE CASCADE).
            return (
                conn.execute(
                    "DELETE FROM conversations WHERE id = ? AND account_id = ?", (conversation_id, account_id)
                ).rowcount
                == 1
            )

        done: bool = await self._write(op)
        return done

    async def add_chat_message(self, message: ChatMessage, account_id: str) -> bool:
        values = list(dataclasses.astuple(message))
        values[_MESSAGE_COST] = _money_text(message.cost)

        def op(conn: sqlite3.Connection) -> bool:
            bumped = conn.execute(
                "UPDATE conversations SET updated_at_ms = max(updated_at_ms, ?)"
                " WHERE id = ? AND account_id = ?",
                (message.created_at_ms, message.conversation_id, account_id),
            ).rowcount
            if bumped != 1:
                return False
            conn.execute(
                f"INSERT INTO chat_messages ({_MESSAGE}) VALUES ({_marks(len(_MESSAGE_COLUMNS))})", values
            )
            return True

        done: bool = await self._write(op)
        return done

    # ------------------------------------------------------------------ the request log

    async def list_request_logs(
        self,
        *,
        account_id: str | None,
        key_id: str | None,
        before: str | None,
        limit: int,
        query: LogQuery | None = None,
    ) -> list[RequestLog]:
        where = _log_filter(account_id, key_id, query)
        if where is None:
            return []
        conditions, args = where
        if before is not None:
            by_id = query is not None and query.request_id is not None
            # The cursor must be an entry of the account listed: another's reads as unknown.
            scope = account_id or (query.account_id if query is not None else None)
            cursor = "SELECT seq FROM request_logs WHERE id = ?" + (" AND account_id = ?" if scope else "")
            conditions.append(f"{'+' if by_id else ''}seq < ({cursor})")
            args.append(before)
            if scope:
                args.append(scope)
        sql = _LIST_LOGS + (" WHERE " + " AND ".join(conditions) if conditions else "")
        sql += " ORDER BY seq DESC LIMIT ?"
        args.append(limit)

        def read(conn: sqlite3.Connection) -> list[RequestLog]:
            return [_request_log(row) for row in conn.execute(sql, args)]

        if query is None:  # by account or key at most: an index gives the page at once
            return read(self._read())
        return await self._scans.run(read)

    async def log_stats(
        self, account_id: str | None, since_ms: int, until_ms: int, bucket_ms: int
    ) -> LogStats:
        if bucket_ms <= 0:
            raise ValueError("bucket_ms must be positive")
        return await self._scans.run(lambda conn: _log_stats(conn, account_id, since_ms, until_ms, bucket_ms))


def _log_filter(
    account_id: str | None, key_id: str | None, query: LogQuery | None
) -> tuple[list[str], list[Any]] | None:
    """The WHERE conditions and their arguments for a list of the request log; None when no entry
    can match (the query names another account or key than the caller)."""
    equal = log_equalities(account_id, key_id, query)
    if equal is None:
        return None
    # A request id finds at most two entries by the primary key: every other condition only checks
    # them (a unary + keeps SQLite from reading an index of that column instead).
    by_id = query is not None and query.request_id is not None
    mark = "+" if by_id else ""
    conditions = [f"{mark}{column} = ?" for column in equal]
    args = list(equal.values())
    if query is None:
        return conditions, args
    if query.status_class is not None:
        conditions.append(f"{mark}status >= ? AND {mark}status < ?")
        args += [query.status_class * 100, query.status_class * 100 + 100]
    if query.since_ms is not None:
        conditions.append(f"{mark}started_at_ms >= ?")
        args.append(query.since_ms)
    if query.until_ms is not None:
        conditions.append(f"{mark}started_at_ms < ?")
        args.append(query.until_ms)
    if query.request_id is not None:
        # The entry with this id, or the one whose usage record has this id: a usage record's
        # request_id is its entry's id (they are written together with the charge); or the entry
        # that started the job of this id (a video, a background response: its id is the one the
        # client holds, and the job has no usage record while it runs, nor once it failed).
        conditions.append(
            "id IN (?, (SELECT request_id FROM usage_records WHERE id = ?), (SELECT request_id FROM jobs"
            " WHERE id = ?)) AND (id = ? OR usage_id = ? OR id = (SELECT request_id FROM jobs WHERE id = ?))"
        )
        args += [query.request_id] * 6
    return conditions, args


# ---------------------------------------------------------------------- statistics


@dataclasses.dataclass(slots=True)
class _Totals:
    """Entries counted: how many, how many failed, and their cost in picodollars plus the costs that
    have no picodollar integer, added from their text."""

    requests: int = 0
    errors: int = 0
    pico: int = 0
    text: Decimal = Decimal(0)

    def add(self, other: _Totals) -> None:
        self.requests += other.requests
        self.errors += other.errors
        self.pico += other.pico
        self.text += other.text

    @property
    def cost(self) -> Decimal:
        return _plain(Decimal(self.pico).scaleb(-12) + self.text)


def _log_stats(
    conn: sqlite3.Connection, account_id: str | None, since_ms: int, until_ms: int, bucket_ms: int
) -> LogStats:
    count = max(0, -(-(until_ms - since_ms) // bucket_ms))
    buckets = [_Totals() for _ in range(count)]
    by_model: list[tuple[str, _Totals]] = []
    with _transaction(conn):  # one snapshot for every query
        models = _models(conn, account_id, since_ms, until_ms) if count else []
        ranges = count * len(models) <= _MAX_RANGES
        for model in models:
            scope = _Scope(account_id, model)
            parts = (
                [(i, scope.totals(conn, *_bucket(i, since_ms, until_ms, bucket_ms))) for i in range(count)]
                if ranges
                else scope.grouped(conn, since_ms, until_ms, bucket_ms)
            )
            whole = _Totals()
            for i, part in parts:
                buckets[i].add(part)
                whole.add(part)
            if model is not None and whole.requests:
                by_model.append((model, whole))
    models_cost = [(model, totals.requests, totals.cost) for model, totals in by_model]
    models_cost.sort(key=lambda m: (-m[2], -m[1], m[0]))
    return LogStats(
        buckets=tuple(
            LogBucket(since_ms + i * bucket_ms, totals.requests, totals.errors, totals.cost)
            for i, totals in enumerate(buckets)
        ),
        by_model=tuple(models_cost),
    )


@contextlib.contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    conn.execute("BEGIN")
    try:
        yield
    finally:
        conn.execute("COMMIT")


# The entries of one model (NULL: without a model), of one account or of all, in a period: by the
# covering index request_logs_account_model or request_logs_model (schema.py).
class _Scope:
    def __init__(self, account_id: str | None, model: str | None) -> None:
        where = ["model IS ?"]
        args: list[Any] = [model]
        if account_id is not None:
            where.insert(0, "account_id = ?")
            args.insert(0, account_id)
        self.where = " AND ".join(where) + " AND started_at_ms >= ? AND started_at_ms < ?"
        self.args = args

    # requests, errors, picodollars, entries whose cost has no picodollar integer
    _TOTALS = (
        "count(*), coalesce(sum(status >= 400), 0), sum(max(cost_pico, 0)), coalesce(sum(cost_pico < 0), 0)"
    )

    def totals(self, conn: sqlite3.Connection, since_ms: int, until_ms: int) -> _Totals:
        """The entries started in [since_ms, until_ms)."""
        args = (*self.args, since_ms, until_ms)
        try:
            n, errors, pico, odd = conn.execute(
                f"SELECT {self._TOTALS} FROM request_logs WHERE {self.where}", args
            ).fetchone()
        except sqlite3.OperationalError as exc:  # the picodollars exceed 64 bits: sum the texts
            if "overflow" not in str(exc):
                raise
            n, errors = conn.execute(
                f"SELECT count(*), coalesce(sum(status >= 400), 0) FROM request_logs WHERE {self.where}", args
            ).fetchone()
            return _Totals(n, errors, 0, self._texts(conn, args, "cost IS NOT NULL"))
        return _Totals(n, errors, pico or 0, self._texts(conn, args, "cost_pico < 0") if odd else Decimal(0))

    def grouped(
        self, conn: sqlite3.Connection, since_ms: int, until_ms: int, bucket_ms: int
    ) -> list[tuple[int, _Totals]]:
        """As totals, for every bucket with entries at once (many buckets: one query, which sorts)."""
        try:
            found = conn.execute(
                f"SELECT (started_at_ms - ?) / ?, {self._TOTALS} FROM request_logs"
                f" WHERE {self.where} GROUP BY 1",
                (since_ms, bucket_ms, *self.args, since_ms, until_ms),
            ).fetchall()
        except sqlite3.OperationalError as exc:
            if "overflow" not in str(exc):
                raise
            found = [(i, 0, 0, 0, 1) for i in range(-(-(until_ms - since_ms) // bucket_ms))]
        return [
            (i, self.totals(conn, *_bucket(i, since_ms, until_ms, bucket_ms)))
            if odd
            else (i, _Totals(n, errors, pico or 0))
            for i, n, errors, pico, odd in found
        ]

    def _texts(self, conn: sqlite3.Connection, args: Sequence[Any], condition: str) -> Decimal:
        found = conn.execute(f"SELECT cost FROM request_logs WHERE {self.where} AND {condition}", args)
        return sum((Decimal(cost) for (cost,) in found), Decimal(0))


def _models(
    conn: sqlite3.Connection, account_id: str | None, since_ms: int, until_ms: int
) -> list[str | None]:
    """The models (None: entries without one) with entries in the period: every model the index
    holds, found by skipping from one to the next (one seek each), then kept if it has an entry in
    the period (one seek each)."""
    scope, args = ("account_id = ?1 AND ", [account_id]) if account_id is not None else ("", [])
    found: list[str | None] = [
        model
        for (model,) in conn.execute(
            "WITH RECURSIVE m(model) AS ("
            f" SELECT min(model) FROM request_logs WHERE {scope}model IS NOT NULL"
            f" UNION ALL SELECT (SELECT min(model) FROM request_logs WHERE {scope}model > m.model)"
            " FROM m WHERE m.model IS NOT NULL"
            ") SELECT model FROM m WHERE model IS NOT NULL",
            args,
        )
    ]
    found.append(None)
    return [
        model
        for model in found
        if conn.execute(
            f"SELECT 1 FROM request_logs WHERE {_Scope(account_id, model).where} LIMIT 1",
            (*_Scope(account_id, model).args, since_ms, until_ms),
        ).fetchone()
    ]


def _bucket(i: int, since_ms: int, until_ms: int, bucket_ms: int) -> tuple[int, int]:
    start = since_ms + i * bucket_ms
    return start, min(until_ms, start + bucket_ms)


def _plain(value: Decimal) -> Decimal:
    """The amount without trailing zeros after its decimal point."""
    if value == value.to_integral_value():
        return value.quantize(Decimal(1))
    return value.normalize()


# ---------------------------------------------------------------------- rows


def _marks(count: int) -> str:
    return ", ".join("?" * count)


def _user(cursor: sqlite3.Cursor) -> ConsoleUser | None:
    row = cursor.fetchone()
    return None if row is None else ConsoleUser(*row)


def _message(row: Sequence[Any]) -> ChatMessage:
    values = list(row)
    values[_MESSAGE_COST] = None if values[_MESSAGE_COST] is None else Decimal(values[_MESSAGE_COST])
    return ChatMessage(*values)

"""The console's records on PostgreSQL (the Console role of store/base.py), and the request log as
the console reads it: filtered lists and statistics (RequestLogs.list_request_logs with a LogQuery,
log_stats). The tables are migrations/0003_console.sql.

Statistics are one statement: the period's entries of the account (or of all) read from an index
that holds what they add up (request_logs_account_started, request_logs_started: index-only scans),
grouped by bucket and model, costs summed as `numeric` (exact).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Awaitable, Callable
from decimal import Decimal
from typing import TYPE_CHECKING, Any, TypeVar

import asyncpg

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
from . import rows

T = TypeVar("T")

_USER_COLUMNS = tuple(f.name for f in dataclasses.fields(ConsoleUser))
_SESSION_COLUMNS = tuple(f.name for f in dataclasses.fields(ConsoleSession))
_CONVERSATION_COLUMNS = tuple(f.name for f in dataclasses.fields(Conversation))
_MESSAGE_COLUMNS = tuple(f.name for f in dataclasses.fields(ChatMessage))
_USER = ", ".join(_USER_COLUMNS)
_SESSION = ", ".join(_SESSION_COLUMNS)
_CONVERSATION = ", ".join(_CONVERSATION_COLUMNS)
_MESSAGE = ", ".join(_MESSAGE_COLUMNS)


class PostgresConsole:
    """The Console role and the console's request log reads, for PostgresStore."""

    if TYPE_CHECKING:

        def _acquire(self) -> contextlib.AbstractAsyncContextManager[asyncpg.Connection]: ...

        async def _tx(self, work: Callable[[asyncpg.Connection], Awaitable[T]]) -> T: ...

        async def _fetchrow(self, sql: str, *args: Any) -> asyncpg.Record | None: ...

        async def _fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]: ...

        async def _execute(self, sql: str, *args: Any) -> str: ...

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
        try:
            await self._execute(
                f"INSERT INTO console_users ({_USER}) VALUES ({rows.marks(len(_USER_COLUMNS))})",
                *dataclasses.astuple(user),
            )
        except asyncpg.UniqueViolationError as exc:
            if exc.constraint_name != "console_users_email_key":
                raise
            raise NameTaken(f"a console user with the email {user.email!r} exists already") from exc
        return user

    async def get_console_user(self, user_id: str) -> ConsoleUser | None:
        return _user(await self._fetchrow(f"SELECT {_USER} FROM console_users WHERE id = $1", user_id))

    async def find_console_user(self, email: str) -> ConsoleUser | None:
        return _user(
            await self._fetchrow(f"SELECT {_USER} FROM console_users WHERE email = $1", email.lower())
        )

    async def find_console_invite(self, invite_hash: bytes, now_ms: int) -> ConsoleUser | None:
        return _user(
            await self._fetchrow(
                f"SELECT {_USER} FROM console_users WHERE invite_hash = $1"
                " AND (invite_expires_at_ms IS NULL OR invite_expires_at_ms > $2)",
                invite_hash,
                now_ms,
            )
        )

    async def list_console_users(self, account_id: str | None = None) -> list[ConsoleUser]:
        if account_id is None:
            found = await self._fetch(f"SELECT {_USER} FROM console_users ORDER BY seq")
        else:
            found = await self._fetch(
                f"SELECT {_USER} FROM console_users WHERE account_id = $1 ORDER BY seq", account_id
            )
        return [ConsoleUser(*row) for row in found]

    async def set_console_password(
        self, user_id: str, password_hash: str, invite: tuple[bytes, int] | None = None
    ) -> bool:
        sql = (
            "UPDATE console_users SET password_hash = $2, invite_hash = NULL, invite_expires_at_ms = NULL"
            " WHERE id = $1"
        )
        args: tuple[object, ...] = (user_id, password_hash)
        if invite is not None:  # only while this invitation is open
            sql += " AND invite_hash = $3 AND (invite_expires_at_ms IS NULL OR invite_expires_at_ms > $4)"
            args += invite

        async def change(conn: asyncpg.Connection) -> bool:
            if rows.count(await conn.execute(sql, *args)) != 1:
                return False
            await conn.execute("DELETE FROM console_sessions WHERE user_id = $1", user_id)
            return True

        return await self._tx(change)

    async def set_console_invite(self, user_id: str, invite_hash: bytes, expires_at_ms: int) -> bool:
        async def invite(conn: asyncpg.Connection) -> bool:
            status = await conn.execute(
                "UPDATE console_users SET password_hash = NULL, invite_hash = $2, invite_expires_at_ms = $3"
                " WHERE id = $1",
                user_id,
                invite_hash,
                expires_at_ms,
            )
            await conn.execute("DELETE FROM console_sessions WHERE user_id = $1", user_id)
            return rows.count(status) == 1

        return await self._tx(invite)

    async def delete_console_user(self, user_id: str) -> bool:
        async def delete(conn: asyncpg.Connection) -> bool:
            await conn.execute("DELETE FROM console_sessions WHERE user_id = $1", user_id)
            return rows.count(await conn.execute("DELETE FROM console_users WHERE id = $1", user_id)) == 1

        return await self._tx(delete)

    # ------------------------------------------------------------------ sessions

    async def create_console_session(self, session: ConsoleSession) -> None:
        await self._execute(
            f"INSERT INTO console_sessions ({_SESSION}) VALUES ({rows.marks(len(_SESSION_COLUMNS))})",
            *dataclasses.astuple(session),
        )

    async def get_console_session(self, session_id: bytes) -> ConsoleSession | None:
        row = await self._fetchrow(f"SELECT {_SESSION} FROM console_sessions WHERE id = $1", session_id)
        return None if row is None else ConsoleSession(*row)

    async def touch_console_session(self, session_id: bytes, seen_at_ms: int) -> None:
        await self._execute(
            "UPDATE console_sessions SET seen_at_ms = greatest(seen_at_ms, $2) WHERE id = $1",
            session_id,
            seen_at_ms,
        )

    async def delete_console_session(self, session_id: bytes) -> None:
        await self._execute("DELETE FROM console_sessions WHERE id = $1", session_id)

    async def purge_console_sessions(self, now_ms: int, idle_ms: int) -> int:
        status = await self._execute(
            "DELETE FROM console_sessions WHERE expires_at_ms <= $1 OR seen_at_ms <= $2",
            now_ms,
            now_ms - idle_ms,
        )
        return rows.count(status)

    # ------------------------------------------------------------------ conversations

    async def create_conversation(self, conversation: Conversation) -> None:
        await self._execute(
            f"INSERT INTO conversations ({_CONVERSATION}) VALUES ({rows.marks(len(_CONVERSATION_COLUMNS))})",
            *dataclasses.astuple(conversation),
        )

    async def list_conversations(self, account_id: str) -> list[Conversation]:
        found = await self._fetch(
            f"SELECT {_CONVERSATION} FROM conversations WHERE account_id = $1"
            " ORDER BY updated_at_ms DESC, seq DESC",
            account_id,
        )
        return [Conversation(*row) for row in found]

    async def get_conversation(
        self, conversation_id: str, account_id: str
    ) -> tuple[Conversation, list[ChatMessage]] | None:
        async def read(conn: asyncpg.Connection) -> tuple[Conversation, list[ChatMessage]] | None:
            row = await conn.fetchrow(
                f"SELECT {_CONVERSATION} FROM conversations WHERE id = $1 AND account_id = $2",
                conversation_id,
                account_id,
            )
            if row is None:
                return None
            messages = await conn.fetch(
                f"SELECT {_MESSAGE} FROM chat_messages WHERE conversation_id = $1 ORDER BY seq",
                conversation_id,
            )
            return Conversation(*row), [ChatMessage(*m) for m in messages]

        return await self._tx(read)  # one snapshot: the messages are the conversation's

    async def rename_conversation(self, conversation_id: str, account_id: str, title: str) -> bool:
        status = await self._execute(
            "UPDATE conversations SET title = $3 WHERE id = $1 AND account_id = $2",
            conversation_id,
            account_id,
            title,
        )
        return rows.count(status) == 1

    async def delete_conversation(self, conversation_id: str, account_id: str) -> bool:
        # Its messages go with it (ON DELETE CASCADE).
        status = await self._execute(
            "DELETE FROM conversations WHERE id = $1 AND account_id = $2", conversation_id, account_id
        )
        return rows.count(status) == 1

    async def add_chat_message(self, message: ChatMessage, account_id: str) -> bool:
        async def add(conn: asyncpg.Connection) -> bool:
            bumped = await conn.fetchval(
                "UPDATE conversations SET updated_at_ms = greatest(updated_at_ms, $3)"
                " WHERE id = $1 AND account_id = $2 RETURNING 1",
                message.conversation_id,
                account_id,
                message.created_at_ms,
            )
            if bumped is None:
                return False
            await conn.execute(
                f"INSERT INTO chat_messages ({_MESSAGE}) VALUES ({rows.marks(len(_MESSAGE_COLUMNS))})",
                *dataclasses.astuple(message),
            )
            return True

        return await self._tx(add)

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
        where = _Where()
        if not where.log_filter(account_id, key_id, query):
            return []
        if before is not None:
            # The cursor must be an entry of the account listed: another's reads as unknown.
            scope = account_id or (query.account_id if query is not None else None)
            if scope:
                cursor, owner = where.arg(before), where.arg(scope)
                where.conditions.append(
                    f"seq < (SELECT seq FROM request_logs WHERE id = {cursor} AND account_id = {owner})"
                )
            else:
                where.add("seq < (SELECT seq FROM request_logs WHERE id = {})", before)
        sql = f"SELECT {rows.LOG_WITHOUT_BODIES} FROM request_logs{where.sql}"
        found = await self._fetch(sql + f" ORDER BY seq DESC LIMIT {where.arg(limit)}", *where.args)
        return [rows.request_log(row) for row in found]

    async def log_stats(
        self, account_id: str | None, since_ms: int, until_ms: int, bucket_ms: int
    ) -> LogStats:
        if bucket_ms <= 0:
            raise ValueError("bucket_ms must be positive")
        count = max(0, -(-(until_ms - since_ms) // bucket_ms))
        scope = "account_id = $4 AND " if account_id is not None else ""
        found = await self._fetch(
            "SELECT (started_at_ms - $1) / $3 AS bucket, model, count(*),"
            " count(*) FILTER (WHERE status >= 400), coalesce(sum(cost), 0)"
            f" FROM request_logs WHERE {scope}started_at_ms >= $1 AND started_at_ms < $2"
            " GROUP BY 1, 2",
            since_ms,
            until_ms,
            bucket_ms,
            *(() if account_id is None else (account_id,)),
        )
        requests = [0] * count
        errors = [0] * count
        costs = [Decimal(0)] * count
        models: dict[str, tuple[int, Decimal]] = {}
        for i, model, n, failed, cost in found:
            requests[i] += n
            errors[i] += failed
            costs[i] += cost
            if model is not None:
                before = models.get(model, (0, Decimal(0)))
                models[model] = (before[0] + n, before[1] + cost)
        by_model = sorted(
            ((model, n, _plain(cost)) for model, (n, cost) in models.items()),
            key=lambda m: (-m[2], -m[1], m[0]),
        )
        return LogStats(
            buckets=tuple(
                LogBucket(since_ms + i * bucket_ms, requests[i], errors[i], _plain(costs[i]))
                for i in range(count)
            ),
            by_model=tuple(by_model),
        )


class _Where:
    """A WHERE clause's conditions and their numbered arguments."""

    def __init__(self) -> None:
        self.conditions: list[str] = []
        self.args: list[Any] = []

    def arg(self, value: Any) -> str:
        self.args.append(value)
        return f"${len(self.args)}"

    def add(self, condition: str, value: Any) -> None:
        """A condition with one argument, named `{}` in it (each `{}` is that argument)."""
        self.conditions.append(condition.replace("{}", self.arg(value)))

    @property
    def sql(self) -> str:
        return " WHERE " + " AND ".join(self.conditions) if self.conditions else ""

    def log_filter(self, account_id: str | None, key_id: str | None, query: LogQuery | None) -> bool:
        """The conditions of a request log list; False when no entry can match (the query names
        another account or key than the caller)."""
        equal = log_equalities(account_id, key_id, query)
        if equal is None:
            return False
        for column, value in equal.items():
            self.add(f"{column} = {{}}", value)
        if query is None:
            return True
        if query.status_class is not None:
            self.add("status >= {}", query.status_class * 100)
            self.add("status < {}", query.status_class * 100 + 100)
        if query.since_ms is not None:
            self.add("started_at_ms >= {}", query.since_ms)
        if query.until_ms is not None:
            self.add("started_at_ms < {}", query.until_ms)
        if query.request_id is not None:
            # The entry with this id, or the one whose usage record has this id: a usage record's
            # request_id is its entry's id (they are written together), so both are found by the
            # primary key; or the entry that started the job of this id (a video, a background
            # response: no usage record while it runs, nor once it failed).
            self.add(
                "id IN ({}, (SELECT request_id FROM usage_records WHERE id = {}),"
                " (SELECT request_id FROM jobs WHERE id = {}))"
                " AND (id = {} OR usage_id = {} OR id = (SELECT request_id FROM jobs WHERE id = {}))",
                query.request_id,
            )
        return True


def _plain(value: Decimal) -> Decimal:
    """The amount without trailing zeros after its decimal point."""
    if value == value.to_integral_value():
        return value.quantize(Decimal(1))
    return value.normalize()


def _user(row: asyncpg.Record | None) -> ConsoleUser | None:
    return None if row is None else ConsoleUser(*row)

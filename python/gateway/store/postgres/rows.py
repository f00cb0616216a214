"""Rows and the money statements of the PostgreSQL store: how records map to columns, and the
settlement and lease arithmetic shared by the writer, jobs and reclaims.

Lock order, kept by every transaction that changes money so that none can deadlock with another:
the lease owner's row (lease only, FOR KEY SHARE), then accounts (by id), then keys (by id), then
lease rows, which are only ever changed under their pot's lock (or are a dead owner's or a job's,
which nobody else touches). The settlement and lease functions of migrations/0002 (gateway_settle,
gateway_lease) take their locks in the same order.
"""

from __future__ import annotations

import base64
import dataclasses
import operator
from collections.abc import Iterable, Sequence
from decimal import Decimal
from typing import Any

import asyncpg
import orjson

from ...budget import spent_at
from .. import Account, ApiKey, Job, KeptAnswer, RequestLog, Settlement, TopUp, UsageRecord

# Column lists in the order of the records' fields, so that a row maps back with Record(*row).
USAGE_COLUMNS = tuple(f.name for f in dataclasses.fields(UsageRecord))
LOG_COLUMNS = tuple(f.name for f in dataclasses.fields(RequestLog))
LOG_BODIES = ("request_body", "response_body")
JOB_COLUMNS = tuple(f.name for f in dataclasses.fields(Job))
ACCOUNT_COLUMNS = ("id", "name", "balance", "allowed_models", "rpm_limit", "tpm_limit", "created_at_ms")
KEY_COLUMNS = (
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
TOP_UP_COLUMNS = ("id", "account_id", "amount", "note", "created_at_ms", "balance_after")

ACCOUNT = ", ".join(ACCOUNT_COLUMNS)
KEY = ", ".join(KEY_COLUMNS)
TOP_UP = ", ".join(TOP_UP_COLUMNS)
USAGE = ", ".join(USAGE_COLUMNS)
LOG = ", ".join(LOG_COLUMNS)
JOB = ", ".join(JOB_COLUMNS)
# Every log column, the bodies read as NULL (lists never carry them).
LOG_WITHOUT_BODIES = ", ".join(f"NULL::bytea AS {c}" if c in LOG_BODIES else c for c in LOG_COLUMNS)


def marks(count: int, start: int = 1) -> str:
    return ", ".join(f"${i}" for i in range(start, start + count))


# A row as the driver returns it (asyncpg.Record), or a slice of one.
Row = asyncpg.Record | Sequence[Any]


# ---------------------------------------------------------------------- mapping


def account(row: Row) -> Account:
    models: list[str] | None = row[3]
    return Account(
        id=row[0],
        name=row[1],
        balance=row[2],
        allowed_models=None if models is None else frozenset(models),
        rpm_limit=row[4],
        tpm_limit=row[5],
        created_at_ms=row[6],
    )


def key(row: Row) -> ApiKey:
    return ApiKey(*row)


def top_up(row: Row) -> TopUp:
    return TopUp(*row)


def usage(row: Row) -> UsageRecord:
    return UsageRecord(*row)


def request_log(row: Row) -> RequestLog:
    return RequestLog(*row)


def job(row: Row) -> Job:
    return Job(*row)


def models_value(models: frozenset[str] | None) -> list[str] | None:
    return None if models is None else sorted(models)


# A record's values in column order, read in one C call (a generator of getattr calls costs a
# settlement's log entry ~18 resumptions of Python code, on every request).
_LOG_VALUES = operator.attrgetter(*LOG_COLUMNS)
_USAGE_VALUES = operator.attrgetter(*USAGE_COLUMNS)
_JOB_VALUES = operator.attrgetter(*JOB_COLUMNS)


def log_values(entry: RequestLog) -> tuple[Any, ...]:
    values: tuple[Any, ...] = _LOG_VALUES(entry)
    return values


def job_values(value: Job) -> tuple[Any, ...]:
    values: tuple[Any, ...] = _JOB_VALUES(value)
    return values


def encode_progress(settlement: Settlement) -> bytes:
    """A stream's settlement so far, for the stream_progress table (log entry without bodies)."""
    entry = settlement.log
    return orjson.dumps(
        {
            "u": [_plain(getattr(settlement.record, c)) for c in USAGE_COLUMNS],
            "l": None
            if entry is None
            else [None if c in LOG_BODIES else _plain(getattr(entry, c)) for c in LOG_COLUMNS],
        }
    )


def decode_progress(data: bytes) -> Settlement:
    value = orjson.loads(data)
    record = dict(zip(USAGE_COLUMNS, value["u"], strict=True))
    record["cost"] = Decimal(record["cost"])
    entry = None
    if value["l"] is not None:
        fields = dict(zip(LOG_COLUMNS, value["l"], strict=True))
        fields["cost"] = None if fields["cost"] is None else Decimal(fields["cost"])
        entry = RequestLog(**fields)
    return Settlement(UsageRecord(**record), entry)


def _plain(value: Any) -> Any:
    return str(value) if isinstance(value, Decimal) else value


def count(status: str) -> int:
    """The row count of a command's status ("UPDATE 3" -> 3)."""
    return int(status.rsplit(" ", 1)[-1])


# ---------------------------------------------------------------------- money


# A settlement batch as one statement, its own transaction when called alone: gateway_settle_json
# (migrations/0004) takes the batch as one JSON parameter and settles it with gateway_settle
# (migrations/0002). One text parameter costs the gateway a few microseconds to send, where
# gateway_settle's 32 array parameters cost it ~93 us for one settlement (asyncpg encodes arrays
# element by element; benches/README.md, 2026-11-29). A batch of at most one settlement (with any
# streams' progress), the usual one while few requests run, is settled by single-row statements
# instead (migrations/0006: the same books for about half the database's CPU).
SETTLE = "SELECT gateway_settle_json($1::text, $2::jsonb)"
# A batch one of whose settlements carries the answer its Idempotency-Key keeps: kept in the same
# statement, so in the same transaction (migrations/0010). Rare (images, speech), so prepared apart.
SETTLE_KEEPING = "SELECT gateway_settle_json($1::text, $2::jsonb), gateway_keep_answers($2::jsonb)"
# Answers kept alone (Store.finish_idempotency, create_job): {"a": [...]} as settle_args writes it.
KEEP_ANSWERS = "SELECT gateway_keep_answers($1::jsonb)"
# Where the money and the bodies are in a usage record's and a log entry's values (their columns'
# order, which gateway_settle's parameters follow).
_USAGE_COST = USAGE_COLUMNS.index("cost")
_LOG_COST = LOG_COLUMNS.index("cost")
_LOG_BODIES = (LOG_COLUMNS.index("request_body"), LOG_COLUMNS.index("response_body"))


async def settle_many(conn: asyncpg.Connection, settlements: Sequence[Settlement], owner: str | None) -> int:
    """Record and charge each settlement once, with its request log entry, in the caller's
    transaction: one applied again (a retried batch, a reclaim) changes nothing, as the usage record
    is inserted only if its id is new and only what was inserted is charged. Charges are summed per
    account and key; they come off the `owner` process's leases too (the money it had set aside is
    spent). One round trip (gateway_settle). Returns how many settlements were new."""
    if not settlements:
        return 0
    return await settle_batch(conn, owner, settlements=settlements)


async def settle_batch(
    conn: asyncpg.Connection,
    owner: str | None,
    *,
    progress: dict[str, bytes] | None = None,
    logs: Sequence[tuple[Any, ...]] = (),
    settlements: Sequence[Settlement] = (),
    ended: Iterable[str] = (),
) -> int:
    """A writer's batch as one statement (gateway_settle, migrations/0002): the latest `progress` of
    running streams (usage id -> encode_progress) kept for `owner`; the log entries `logs`
    (log_values), then those of `settlements`, inserted in that order; the settlements recorded and
    charged as settle_many says; the progress of the `ended` streams deleted. Returns how many
    settlements were new; the answers they carry are kept in the same statement."""
    args = settle_args(owner, progress=progress, logs=logs, settlements=settlements, ended=ended)
    result: int = await conn.fetchval(SETTLE_KEEPING if keeps_answers(settlements) else SETTLE, *args)
    return result


def settle_args(
    owner: str | None,
    *,
    progress: dict[str, bytes] | None = None,
    logs: Sequence[tuple[Any, ...]] = (),
    settlements: Sequence[Settlement] = (),
    ended: Iterable[str] = (),
) -> tuple[str | None, str]:
    """The arguments of SETTLE for a batch (settle_batch): the owner and the batch as JSON, as
    migrations/0004 reads it (money as decimal text, bodies and progress as base64)."""
    entries = list(logs) + [log_values(s.log) for s in settlements if s.log is not None]
    progress = progress or {}
    batch = {
        "pi": list(progress),
        "pd": [_base64(data) for data in progress.values()],
        "u": [_usage_json(s.record) for s in settlements],
        "l": [_log_json(values) for values in entries],
        "e": list(ended),
    }
    answers = [s.answer for s in settlements if s.answer is not None]
    if answers:  # read by gateway_keep_answers only (SETTLE_KEEPING)
        batch["a"] = [_answer_json(a) for a in answers]
    return owner, orjson.dumps(batch).decode()


def keeps_answers(settlements: Iterable[Settlement]) -> bool:
    """Whether a batch must be settled by SETTLE_KEEPING."""
    return any(s.answer is not None for s in settlements)


def answers_arg(answers: Sequence[KeptAnswer]) -> str:
    """KEEP_ANSWERS's argument."""
    return orjson.dumps({"a": [_answer_json(a) for a in answers]}).decode()


def _answer_json(kept: KeptAnswer) -> list[Any]:
    answer = kept.answer
    return [
        kept.key_id,
        kept.idempotency_key,
        kept.fingerprint,
        answer.status,
        _base64(orjson.dumps(answer.headers)),
        _base64(answer.body),
        kept.expires_at_ms,
    ]


def _usage_json(record: UsageRecord) -> list[Any]:
    row: list[Any] = list(_USAGE_VALUES(record))
    row[_USAGE_COST] = str(row[_USAGE_COST])
    return row


def _log_json(values: tuple[Any, ...]) -> list[Any]:
    row = list(values)
    if row[_LOG_COST] is not None:
        row[_LOG_COST] = str(row[_LOG_COST])
    for i in _LOG_BODIES:
        if row[i] is not None:
            row[i] = _base64(row[i])
    return row


def _base64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


async def add_to_lease(conn: asyncpg.Connection, kind: str, pot_id: str, owner: str, delta: Decimal) -> None:
    """Grow (or, with a negative delta, shrink) an owner's lease on a pot whose lock the caller holds;
    a lease never goes below zero, and an empty one is deleted."""
    if delta > 0:
        await conn.execute(
            "INSERT INTO leases (kind, pot_id, owner, amount) VALUES ($1, $2, $3, $4)"
            " ON CONFLICT (kind, pot_id, owner) DO UPDATE SET amount = leases.amount + excluded.amount",
            kind,
            pot_id,
            owner,
            delta,
        )
    elif delta < 0:
        where = "kind = $1 AND pot_id = $2 AND owner = $3"
        await conn.execute(
            f"UPDATE leases SET amount = greatest(0, amount + $4) WHERE {where}", kind, pot_id, owner, delta
        )
        await conn.execute(f"DELETE FROM leases WHERE {where} AND amount <= 0", kind, pot_id, owner)


async def lock_pot(conn: asyncpg.Connection, kind: str, pot_id: str) -> asyncpg.Record | None:
    """Lock a pot's row for a change of its leases; the row (None: no such account or key)."""
    if kind == "account":
        row: asyncpg.Record | None = await conn.fetchrow(
            "SELECT balance FROM accounts WHERE id = $1 FOR UPDATE", pot_id
        )
    elif kind == "key":
        row = await conn.fetchrow(
            "SELECT credit_limit, limit_reset, spent, spent_period_ms FROM api_keys WHERE id = $1 FOR UPDATE",
            pot_id,
        )
    else:
        raise ValueError(f"unknown pot kind {kind!r}")
    return row


async def free(
    conn: asyncpg.Connection, kind: str, pot_id: str, now_ms: int, *, lock: bool
) -> Decimal | None:
    """What a pot holds that no owner has leased: the account's balance, or what is left of the key's
    credit limit in the period containing `now_ms` (None: the key has no limit). With `lock`, the
    pot's row is locked for the caller's transaction first."""
    if lock:
        row = await lock_pot(conn, kind, pot_id)
    elif kind == "account":
        row = await conn.fetchrow("SELECT balance FROM accounts WHERE id = $1", pot_id)
    elif kind == "key":
        row = await conn.fetchrow(
            "SELECT credit_limit, limit_reset, spent, spent_period_ms FROM api_keys WHERE id = $1", pot_id
        )
    else:
        raise ValueError(f"unknown pot kind {kind!r}")
    if row is None:
        if kind == "key":  # no such key: nothing to lease
            return Decimal(0)
        total = Decimal(0)
    elif kind == "account":
        total = row[0]
    else:
        limit, reset, spent, period = row
        if limit is None:
            return None
        total = limit - spent_at(reset, spent, period, now_ms)
    leased = await conn.fetchval(
        "SELECT coalesce(sum(amount), 0) FROM leases WHERE kind = $1 AND pot_id = $2", kind, pot_id
    )
    result: Decimal = total - leased
    return result

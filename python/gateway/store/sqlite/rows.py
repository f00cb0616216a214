"""How the SQLite store's rows map to the records (gateway.store.records), and back."""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Sequence
from decimal import Decimal
from itertools import chain
from typing import Any

from ..records import (
    JOB_RUNNING,
    LOG_COLUMNS,
    USAGE_COLUMNS,
    Account,
    ApiKey,
    Job,
    RequestLog,
    TopUp,
    UsageRecord,
)

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
    "prices",
)
_JOB = ", ".join(_JOB_COLUMNS)
_HOLD, _COST = _JOB_COLUMNS.index("hold"), _JOB_COLUMNS.index("cost")
_RUNNING = f"status IN ({', '.join(repr(status) for status in JOB_RUNNING)})"
_LOG_HEAD = ", ".join(_LOG_COLUMNS[:13])  # every column up to the bodies
INSERT_LOG = f"INSERT OR IGNORE INTO request_logs ({_LOG})"
INSERT_USAGE = f"INSERT INTO usage_records ({_COLUMNS})"
# Rows one INSERT statement carries at most. executemany runs its statement once a row, and each
# run gives the GIL up and takes it back (CPython's sqlite3 releases it around every step): a
# hand-off with the event loop, on the core they share, for every row of a group commit. A
# statement of many rows is one step. 32 rows of the widest table (17 columns) stay far inside
# SQLite's smallest bound on a statement's parameters (999).
ROWS_PER_INSERT = 32


def insert_rows(conn: sqlite3.Connection, head: str, rows: Sequence[Sequence[Any]]) -> None:
    """`head` ("INSERT ... INTO table (columns)") with `rows`, in order, ROWS_PER_INSERT a statement
    (each statement's text is made and prepared once per row count, then cached)."""
    for start in range(0, len(rows), ROWS_PER_INSERT):
        chunk = rows[start : start + ROWS_PER_INSERT]
        conn.execute(_values_sql(head, len(chunk[0]), len(chunk)), list(chain.from_iterable(chunk)))


@functools.cache
def _values_sql(head: str, width: int, count: int) -> str:
    row = f"({', '.join('?' * width)})"
    return f"{head} VALUES {', '.join([row] * count)}"


def usage_row(r: UsageRecord) -> tuple[str, str, str, str, str, str, int, int, str, int, int]:
    """The record as one flat row, in USAGE_COLUMNS order (money as decimal text), as the table and
    the settlement journal keep it."""
    return (
        r.id,
        r.request_id,
        r.key_id,
        r.account_id,
        r.model,
        r.status,
        r.prompt_tokens,
        r.completion_tokens,
        str(r.cost),
        r.started_at_ms,
        r.ended_at_ms,
    )


def usage_record(row: Sequence[Any]) -> UsageRecord:
    return UsageRecord(
        row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], Decimal(row[8]), row[9], row[10]
    )


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


def _money_text(value: Decimal | None) -> str | None:
    return None if value is None else str(value)


# Allowed models as comma-separated names (a model name never holds a comma). NULL allows every model;
# the empty text is the empty set, which allows none.
def _models(text: str | None) -> frozenset[str] | None:
    return None if text is None else frozenset(filter(None, text.split(",")))


def _models_text(models: frozenset[str] | None) -> str | None:
    return None if models is None else ",".join(sorted(models))

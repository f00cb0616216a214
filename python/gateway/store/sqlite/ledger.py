"""Money in the SQLite store: settlements applied exactly once, leases against a pot's free money,
a key's spending in its credit-limit period, and the replay of dead processes' journals. Every
function runs inside the caller's write transaction."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator, Sequence
from decimal import Decimal
from pathlib import Path

import orjson

from ...budget import counted, spent_now
from ..records import JOB_LEASE_PREFIX, KeptAnswer, Settlement, UsageRecord
from . import journal
from .rows import _KEY, INSERT_LOG, INSERT_USAGE, _key, _log_values, insert_rows, usage_row

log = logging.getLogger("gateway.store")


def _settle_many(conn: sqlite3.Connection, settlements: Sequence[Settlement], owner: str | None) -> int:
    """Record and charge each settlement once, with its request log entry: one applied again
    (journal replay, a retried batch) changes nothing. Charges are summed per account, key and
    lease, so a batch costs a handful of statements. The charges come off the `owner` process's
    leases too: the money it had set aside is spent. Returns how many settlements were new."""
    if not settlements:
        return 0
    insert_rows(conn, INSERT_LOG, [_log_values(s.log) for s in settlements if s.log is not None])
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
    insert_rows(conn, INSERT_USAGE, [usage_row(r) for r in fresh.values()])
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
    _keep_answers(conn, [s.answer for s in settlements if s.answer is not None])
    return len(fresh)


def _keep_answers(conn: sqlite3.Connection, answers: Sequence[KeptAnswer]) -> None:
    """Each answer kept for its Idempotency-Key, if the request that made it still holds the key
    (applied again, or after another request took the key over, it changes nothing)."""
    if answers:
        conn.executemany(
            "UPDATE idempotency SET state = 'done', status = ?, headers = ?, body = ?, expires_at_ms = ?"
            " WHERE key_id = ? AND idempotency_key = ? AND fingerprint = ? AND state = 'running'",
            [
                (
                    a.answer.status,
                    orjson.dumps(a.answer.headers),
                    a.answer.body,
                    a.expires_at_ms,
                    a.key_id,
                    a.idempotency_key,
                    a.fingerprint,
                )
                for a in answers
            ],
        )


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
    (and any lease whose owner has no journal left) and the Idempotency-Keys their requests held.
    Returns how many settlements were new."""
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
            # Their requests run no more: an Idempotency-Key one of them held is free for a retry.
            dead = {orphan.owner for orphan in found} | {owner for (owner,) in gone}
            conn.executemany(
                "DELETE FROM idempotency WHERE state = 'running' AND owner = ?", [(o,) for o in dead]
            )
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


def _count_key_spend(conn: sqlite3.Connection, r: UsageRecord) -> None:
    """Add the cost to what the key spent in its credit-limit period (gateway.budget.counted). Only
    keys with a limit keep the count: the rest cost the writer one index lookup, not a row update."""
    row = conn.execute(
        "SELECT limit_reset, spent, spent_period_ms FROM api_keys WHERE id = ? AND credit_limit IS NOT NULL",
        (r.key_id,),
    ).fetchone()
    if row is None:
        return
    reset, spent, current = row
    total, period = counted(reset, Decimal(spent), current, r.cost, r.ended_at_ms)
    conn.execute(
        "UPDATE api_keys SET spent = ?, spent_period_ms = ? WHERE id = ?", (str(total), period, r.key_id)
    )

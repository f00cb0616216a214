"""The background writer of one process: settlements, request log entries and stream progress,
group-committed.

`settle` queues its settlement with a future and waits for it. The writer task takes everything
queued (settlements, fire-and-forget log entries, the latest progress of each running stream and
the streams that ended without a settlement) and commits it in one transaction, then resolves every
settlement's future. While one commit is in flight the next batch gathers, so under load each
commit carries many settlements (about a commit's time of them, a millisecond or two), and an
unloaded request waits for exactly one commit, with no added linger.

A batch is one statement, `SELECT gateway_settle(...)` (migrations/0002, rows.settle_batch), its
columns sent as arrays: one round trip, and its own transaction, instead of BEGIN, a statement per
step and COMMIT (measured by benches/pg_settle.py: a settlement at concurrency 1 took 1.4 ms in six
or seven round trips, 0.53 ms in one). The commit stays durable: nothing sets synchronous_commit
off, so a settlement is on the database's disk (WAL flushed) before its request is answered; a
database that crashes loses no charge it had acknowledged.

A batch that fails because the database is out of reach is kept and retried, with backoff, until it
commits: a settlement is never dropped (its usage id makes a retry that had in fact committed change
nothing). A batch refused by the database (a bug, never expected) is retried item by item so that
one bad item fails alone: a bad settlement fails its caller, a bad log entry or progress is logged
and dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field, replace
from typing import Any

import asyncpg

from .. import RequestLog, Settlement
from . import rows
from .errors import unavailable

log = logging.getLogger("gateway.store")

# Settlements per transaction, at most; more wait for the next one.
MAX_BATCH = 512
MAX_LOG_BATCH = 2048
# Request log bodies waiting for the writer beyond this are not kept (their entries are), as SQLite.
MAX_LOG_BACKLOG_BYTES = 4 * 1024 * 1024
# Log entries waiting beyond this (the database has been away a long time) are dropped.
MAX_PENDING_LOGS = 100_000
# The longest pause between two attempts at a batch while the database is away.
MAX_RETRY_SECONDS = 1.0

Acquire = Callable[[], AbstractAsyncContextManager[asyncpg.Connection]]


@dataclass(slots=True)
class _Batch:
    settlements: list[tuple[Settlement, asyncio.Future[None]]] = field(default_factory=list)
    logs: list[tuple[tuple[Any, ...], int]] = field(default_factory=list)  # values, body bytes
    progress: dict[str, bytes] = field(default_factory=dict)
    forgets: set[str] = field(default_factory=set)


class Writer:
    def __init__(self, acquire: Acquire, owner: str) -> None:
        self._acquire = acquire
        self.owner = owner
        self._settlements: deque[tuple[Settlement, asyncio.Future[None]]] = deque()
        self._logs: deque[tuple[tuple[Any, ...], int]] = deque()
        self._progress: dict[str, bytes] = {}
        self._forgets: set[str] = set()
        # Streams whose progress may be in the database: their settlement deletes it.
        self._noted: set[str] = set()
        self._wake = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self._log_backlog = 0
        self._bodies_dropped = 0
        self._logs_dropped = 0
        self._failing_since: float | None = None

    # ------------------------------------------------------------------ the callers' side

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="gateway-postgres-writer")

    def settle(self, settlement: Settlement) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._progress.pop(settlement.record.id, None)  # its final settlement deletes any progress
        self._settlements.append((settlement, future))
        self._wake.set()
        return future

    def log(self, entry: RequestLog) -> None:
        if len(self._logs) >= MAX_PENDING_LOGS:
            self._logs_dropped += 1
            if self._logs_dropped in (1, 1000) or self._logs_dropped % 100_000 == 0:
                log.error("the database is away: %d request log entries dropped", self._logs_dropped)
            return
        bodies = len(entry.request_body or b"") + len(entry.response_body or b"")
        if bodies and self._log_backlog + bodies > MAX_LOG_BACKLOG_BYTES:
            entry = replace(entry, request_body=None, response_body=None)
            bodies = 0
            self._bodies_dropped += 1
            if self._bodies_dropped in (1, 1000) or self._bodies_dropped % 100_000 == 0:
                log.warning(
                    "request log writes are behind: %d entries kept without bodies", self._bodies_dropped
                )
        self._log_backlog += bodies
        self._logs.append((rows.log_values(entry), bodies))
        self._wake.set()

    def progress(self, settlement: Settlement) -> None:
        self._noted.add(settlement.record.id)
        self._progress[settlement.record.id] = rows.encode_progress(settlement)
        self._wake.set()

    def forget(self, usage_id: str) -> None:
        self._progress.pop(usage_id, None)
        self._forgets.add(usage_id)
        self._wake.set()

    @property
    def pending(self) -> int:
        return len(self._settlements) + len(self._logs) + len(self._progress) + len(self._forgets)

    async def close(self, timeout: float) -> None:
        """Commit what is queued (waiting at most `timeout` seconds for the database) and stop."""
        self._closing = True
        self._wake.set()
        if self._task is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout)
        except TimeoutError:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            log.error(
                "closing with the database away: %d settlements and %d log entries not written",
                len(self._settlements),
                len(self._logs),
            )
        self._task = None

    # ------------------------------------------------------------------ the task

    async def _run(self) -> None:
        while True:
            if not self.pending:
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
                # Let the tasks that are ready now queue theirs too: one commit for all of them.
                await asyncio.sleep(0)
            try:
                await self._flush(self._take())
            except Exception:  # never expected; the task must not die
                log.exception("the store's writer failed")
                await asyncio.sleep(MAX_RETRY_SECONDS)

    def _take(self) -> _Batch:
        batch = _Batch()
        while self._settlements and len(batch.settlements) < MAX_BATCH:
            batch.settlements.append(self._settlements.popleft())
        while self._logs and len(batch.logs) < MAX_LOG_BATCH:
            batch.logs.append(self._logs.popleft())
        batch.progress, self._progress = self._progress, {}
        batch.forgets, self._forgets = self._forgets, set()
        return batch

    async def _flush(self, batch: _Batch) -> None:
        delay = 0.05
        while True:
            try:
                async with self._acquire() as conn:
                    await self._commit(conn, batch)
                break
            except Exception as exc:
                if not (unavailable(exc) or isinstance(exc, asyncpg.TransactionRollbackError)):
                    try:
                        await self._isolate(batch, exc)
                        break
                    except Exception as again:  # only the database going away gets here
                        exc = again
                self._failing(exc, batch)
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_RETRY_SECONDS)
        if self._failing_since is not None:
            log.warning(
                "the database is back: writes resumed after %.1f s", time.monotonic() - self._failing_since
            )
            self._failing_since = None
        self._log_backlog -= sum(bodies for _, bodies in batch.logs)
        self._noted -= batch.forgets
        self._noted.difference_update(s.record.id for s, _ in batch.settlements)
        for _, future in batch.settlements:
            if not future.done():
                future.set_result(None)

    def _failing(self, exc: Exception, batch: _Batch) -> None:
        if self._failing_since is None:
            self._failing_since = time.monotonic()
            log.error(
                "the database is away (%s): %d settlements wait, retrying until they commit",
                exc,
                len(batch.settlements) + len(self._settlements),
            )

    async def _commit(self, conn: asyncpg.Connection, batch: _Batch) -> None:
        """The whole batch in one statement, one round trip: its own transaction (rows.settle_batch)."""
        settled = [s for s, _ in batch.settlements]
        await rows.settle_batch(
            conn,
            self.owner,
            progress=batch.progress,
            logs=[values for values, _ in batch.logs],
            settlements=settled,
            ended=batch.forgets | {s.record.id for s in settled if s.record.id in self._noted},
        )

    async def _isolate(self, batch: _Batch, exc: Exception) -> None:
        """The database refused the batch: commit its items one by one, so that only what it
        refuses fails. A connection lost meanwhile ends this pass; the whole batch is then tried
        again (every item of it is idempotent)."""
        log.error("the database refused a batch of writes (%s); retrying item by item", exc, exc_info=exc)
        parts: list[_Batch] = [_Batch(settlements=[item]) for item in batch.settlements]
        parts += [_Batch(logs=[item]) for item in batch.logs]
        parts += [_Batch(progress={k: v}) for k, v in batch.progress.items()]
        if batch.forgets:
            parts.append(_Batch(forgets=batch.forgets))
        for part in parts:
            try:
                async with self._acquire() as conn:
                    await self._commit(conn, part)
            except Exception as failure:
                if unavailable(failure):
                    raise
                for _, future in part.settlements:
                    if not future.done():
                        future.set_exception(failure)
                if not part.settlements:
                    log.error("a write was refused and dropped: %s", failure)

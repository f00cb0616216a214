"""The background writer of one process: settlements, request log entries and stream progress,
group-committed.

`settle` queues its settlement with a future and waits for it. A batch is everything queued
(settlements, fire-and-forget log entries, the latest progress of each running stream and the
streams that ended without a settlement), committed in one transaction on one of the writer's own
MAX_IN_FLIGHT connections; every settlement's future resolves once its batch is in the database's
hands (below). A settlement that finds a connection free starts its batch itself, in its own task
(no hop through the writer task: at concurrency 1 that is most of what an answer waits for);
otherwise the writer task starts the next batch when a connection frees up, so under load each
commit carries many settlements (about a commit's time of them, a millisecond or two).

A batch is one statement, `SELECT gateway_settle_json(...)` (migrations/0004, then 0002's
gateway_settle; a batch of at most one settlement by migrations/0006's single-row statements;
rows.settle_batch), the batch sent as one JSON parameter: one round trip, and its own transaction,
instead of BEGIN, a statement per step and COMMIT (measured by benches/pg_settle.py: a settlement
at concurrency 1 took 1.4 ms in six or seven round trips, 0.53 ms in one). The commit is durable
(nothing sets synchronous_commit off).

A settlement's caller is released once its batch has been handed to the database: the statement
written whole to the connection's socket (`_sent`), not when its commit returns, which would add the
database's round trip and WAL flush (0.5-0.9 ms here) to every answer. This is the embedded
journal's promise (store/sqlite/journal.py: one write(2), then the answer) with the database in the
journal's place: from then on a killed gateway process cannot lose the charge, because the database
runs and commits a statement it has received whether or not its client is still there (the writer
connections set client_connection_check_interval to 0 so that no server setting cancels it), and a
database that fails before committing it leaves the writer, still holding the batch, to retry it
until it commits. A charge is lost only if both fail at once: the gateway process dies while the
database is away or before the bytes left its machine. When the hand-over cannot be seen (the
socket did not take the statement whole, or another driver version), callers wait for the commit.

A batch that fails because the database is out of reach is kept and retried, with backoff, until it
commits: a settlement is never dropped (its usage id makes a retry that had in fact committed change
nothing). A batch refused by the database (a bug, never expected) is retried item by item so that
one bad item fails alone: a bad settlement fails its caller, a bad log entry or progress is logged
and dropped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from .. import RequestLog, Settlement
from ..log_backlog import LogBodyBacklog
from . import rows
from .errors import connects_refused, unavailable

log = logging.getLogger("gateway.store")

# Settlements per transaction, at most; more wait for the next one.
MAX_BATCH = 512
MAX_LOG_BATCH = 2048
# Log entries waiting beyond this (the database has been away a long time) are dropped.
MAX_PENDING_LOGS = 100_000
# The writer's connections, so batches in flight at once: a batch is sent while the one before it
# commits (at concurrency 1 the previous request's commit is often still under way).
MAX_IN_FLIGHT = 2
# The longest pause between two attempts at a batch while the database is away.
MAX_RETRY_SECONDS = 1.0

Connect = Callable[[], Awaitable[asyncpg.Connection]]


@dataclass(slots=True)
class _Line:
    """One of the writer's connections, with the settlement statement prepared on it (so that every
    batch is one Bind/Execute/Sync, whose hand-over _sent can see)."""

    conn: asyncpg.Connection
    settle: asyncpg.prepared_stmt.PreparedStatement


@dataclass(slots=True)
class _Batch:
    settlements: list[tuple[Settlement, asyncio.Future[None]]] = field(default_factory=list)
    logs: list[tuple[tuple[Any, ...], int]] = field(default_factory=list)  # values, body bytes
    progress: dict[str, bytes] = field(default_factory=dict)
    forgets: set[str] = field(default_factory=set)
    released: bool = False  # its callers were released before its commit (Writer.committed)


class Writer:
    def __init__(self, connect: Connect, owner: str) -> None:
        self._connect = connect
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
        self._bodies = LogBodyBacklog()
        self._logs_dropped = 0
        self._failing_since: float | None = None
        # The writer's connections: idle ones, and how many are open (idle or in use).
        self._idle: list[_Line] = []
        self._open = 0
        self._freed = asyncio.Event()
        # Batches under way (each followed by its task to its commit) and their contents.
        self._in_flight: dict[asyncio.Task[None], _Batch] = {}
        # Batches whose callers were released before their commit; reads wait for them (committed).
        self._unconfirmed = 0
        self._committed = asyncio.Event()
        self._committed.set()

    # ------------------------------------------------------------------ the callers' side

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="gateway-postgres-writer")

    async def settle(self, settlement: Settlement) -> asyncio.Future[None]:
        """Queue `settlement`; when a connection is free, start its batch at once and wait for the
        hand-over (one turn of the event loop). Returns the future that resolves at the hand-over
        (or the commit)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._progress.pop(settlement.record.id, None)  # its final settlement deletes any progress
        self._settlements.append((settlement, future))
        if self._idle and not self._closing and not self._must_wait():
            line = self._idle.pop()
            batch = self._take()
            if self.pending:  # more than one batch's worth: the writer task takes the rest
                self._wake.set()
            await self._hand_over(line, batch, self._launch(line, batch))
        else:
            self._wake.set()
        return future

    def log(self, entry: RequestLog) -> None:
        if len(self._logs) >= MAX_PENDING_LOGS:
            self._logs_dropped += 1
            if self._logs_dropped in (1, 1000) or self._logs_dropped % 100_000 == 0:
                log.error("the database is away: %d request log entries dropped", self._logs_dropped)
            return
        entry, bodies = self._bodies.admit(entry)
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

    async def committed(self) -> None:
        """Returns once every settlement whose caller has been released has committed: a read made
        after a settlement in the same process sees it."""
        if not self._committed.is_set():
            await self._committed.wait()

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
            tasks = [self._task, *self._in_flight]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            log.error(
                "closing with the database away: %d settlements and %d log entries not written",
                len(self._settlements),
                len(self._logs),
            )
        self._task = None
        for line in self._idle:
            line.conn.terminate()
        self._idle.clear()

    # ------------------------------------------------------------------ batches

    async def _run(self) -> None:
        """The writer task: starts the batches no caller started (log entries and progress, and
        settlements queued while every connection was busy)."""
        delay = 0.05
        while True:
            if not self.pending:
                if self._closing:
                    if self._in_flight:
                        await asyncio.wait(list(self._in_flight))
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                line = await self._connection()
                if not self.pending:  # a caller took it meanwhile
                    self._give_back(line)
                    continue
                if self._must_wait():
                    # Stream progress commits in order (_must_wait): wait for the batch writing it.
                    self._give_back(line)
                    await asyncio.wait([t for t, b in self._in_flight.items() if b.progress])
                    continue
                batch = self._take()
                sending = self._launch(line, batch)
                await self._hand_over(line, batch, sending)
                if not batch.released:
                    # Not seen handed over: let the next batch gather until this one commits.
                    await asyncio.wait([sending])
                delay = 0.05
            except Exception as exc:
                if not unavailable(exc):  # never expected; the task must not die
                    log.exception("the store's writer failed")
                self._failing(exc, len(self._settlements))
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_RETRY_SECONDS)

    def _must_wait(self) -> bool:
        """Whether the next batch touches stream progress while a batch writing progress is in
        flight: it must commit after that one. A stream's end (which deletes its progress) committed
        first would leave the progress behind; newer progress committed first would be overwritten
        by the older."""
        if not any(batch.progress for batch in self._in_flight.values()):
            return False
        return (
            bool(self._forgets)
            or bool(self._progress)
            or any(s.record.id in self._noted for s, _ in self._settlements)
        )

    def _take(self) -> _Batch:
        batch = _Batch()
        while self._settlements and len(batch.settlements) < MAX_BATCH:
            batch.settlements.append(self._settlements.popleft())
        while self._logs and len(batch.logs) < MAX_LOG_BATCH:
            batch.logs.append(self._logs.popleft())
        batch.progress, self._progress = self._progress, {}
        batch.forgets, self._forgets = self._forgets, set()
        return batch

    def _launch(self, line: _Line, batch: _Batch) -> asyncio.Future[None]:
        """Start writing `batch` on `line` (its statement runs from the next turn of the event loop)
        and follow it to its commit, in one task; returns a future that ends with the statement
        (its first try): the writer task waits on it, not on the retries."""
        loop = asyncio.get_running_loop()
        sending: asyncio.Future[None] = loop.create_future()
        follow = loop.create_task(self._follow(line, batch, sending))
        self._in_flight[follow] = batch
        follow.add_done_callback(self._finished)
        return sending

    async def _hand_over(self, line: _Line, batch: _Batch, sending: asyncio.Future[Any]) -> None:
        """Release the batch's callers once its statement is in the database's hands (_sent)."""
        if rows.keeps_answers(s for s, _ in batch.settlements):
            # SETTLE_KEEPING is prepared on a connection's first use, in a round trip of its own
            # that _sent could take for the statement: these callers (rare) wait for the commit.
            return
        if not await _sent(line.conn, sending):
            return
        waiting = [future for _, future in batch.settlements if not future.done()]
        if not waiting:
            return
        batch.released = True
        self._unconfirmed += 1  # until _follow has seen this batch commit
        self._committed.clear()
        for future in waiting:
            future.set_result(None)

    async def _follow(self, line: _Line, batch: _Batch, sending: asyncio.Future[None]) -> None:
        """Run the batch's statement and await its commit (`sending` ends with it); retry it until
        it commits if it failed; then settle the books."""
        try:
            await self._statement(line, batch)
            self._give_back(line)
        except asyncio.CancelledError:
            self._discard(line)
            if not sending.done():
                sending.cancel()
            raise
        except Exception as exc:
            self._discard(line)
            sending.set_result(None)
            await self._retry(batch, exc)
        else:
            sending.set_result(None)
        if self._failing_since is not None:
            log.warning(
                "the database is back: writes resumed after %.1f s", time.monotonic() - self._failing_since
            )
            self._failing_since = None
        self._bodies.release(sum(bodies for _, bodies in batch.logs))
        self._noted -= batch.forgets
        self._noted.difference_update(s.record.id for s, _ in batch.settlements)
        for _, future in batch.settlements:
            if not future.done():
                future.set_result(None)
        if batch.released:
            self._unconfirmed -= 1
            if not self._unconfirmed:
                self._committed.set()

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._in_flight.pop(task, None)
        if not task.cancelled() and task.exception() is not None:  # never expected
            log.error("a batch of the store's writer failed", exc_info=task.exception())
        # The writer task waits on `_wake` only while nothing is pending (a connection it waits
        # for is `_freed`, progress in flight is waited on by its task): woken now, it would only
        # find nothing to do, a turn of its task per batch at concurrency 1.
        if self.pending:
            self._wake.set()

    async def _retry(self, batch: _Batch, exc: Exception) -> None:
        """The batch failed: while the database is away, try it again (with backoff) until it
        commits; if the database refused it (a bug), commit its items one by one."""
        delay = 0.05
        while True:
            if isinstance(exc, asyncpg.InvalidCachedStatementError):
                # The schema changed under the prepared statement (a migration): prepare it afresh.
                while self._idle:
                    self._discard(self._idle.pop())
            elif not (unavailable(exc) or isinstance(exc, asyncpg.TransactionRollbackError)):
                try:
                    await self._isolate(batch, exc)
                    return
                except Exception as again:  # only the database going away gets here
                    exc = again
            self._failing(exc, len(batch.settlements) + len(self._settlements))
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_RETRY_SECONDS)
            try:
                await self._commit_on_own(batch)
                return
            except Exception as again:
                exc = again

    async def _commit_on_own(self, batch: _Batch) -> None:
        line = await self._connection()
        try:
            await self._statement(line, batch)
        except BaseException:
            self._discard(line)
            raise
        self._give_back(line)

    @property
    def failing(self) -> float | None:
        """For how many seconds writes have been failing (None: they go through)."""
        since = self._failing_since
        return None if since is None else time.monotonic() - since

    def _failing(self, exc: BaseException, waiting: int) -> None:
        if self._failing_since is None:
            self._failing_since = time.monotonic()
            log.error(
                "the database is away (%s): %d settlements wait, retrying until they commit", exc, waiting
            )

    async def _statement(self, line: _Line, batch: _Batch) -> None:
        """The whole batch in one statement, one round trip: its own transaction (rows.settle_batch)."""
        settled = [s for s, _ in batch.settlements]
        args = rows.settle_args(
            self.owner,
            progress=batch.progress,
            logs=[values for values, _ in batch.logs],
            settlements=settled,
            ended=batch.forgets | {s.record.id for s in settled if s.record.id in self._noted},
        )
        if rows.keeps_answers(settled):
            await line.conn.fetchval(rows.SETTLE_KEEPING, *args)  # prepared by asyncpg's cache
        else:
            await line.settle.fetchval(*args)

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
                await self._commit_on_own(part)
            except Exception as failure:
                if unavailable(failure):
                    raise
                released = False
                for _, future in part.settlements:
                    if future.done():
                        released = True  # its caller was released at the hand-over: only a log is left
                    else:
                        future.set_exception(failure)
                if released or not part.settlements:
                    log.error("a write was refused and dropped: %s", failure)

    # ------------------------------------------------------------------ connections

    async def _connection(self) -> _Line:
        """An idle connection of the writer's, or a new one while fewer than MAX_IN_FLIGHT are open;
        otherwise waits for one to be given back."""
        while True:
            if self._idle:
                return self._idle.pop()
            if self._open < MAX_IN_FLIGHT:
                self._open += 1
                conn: asyncpg.Connection | None = None
                try:
                    conn = await connects_refused(self._connect())
                    return _Line(conn, await conn.prepare(rows.SETTLE))
                except BaseException:
                    self._open -= 1
                    if conn is not None:
                        conn.terminate()
                    raise
            self._freed.clear()
            await self._freed.wait()

    def _give_back(self, line: _Line) -> None:
        self._idle.append(line)
        self._freed.set()

    def _discard(self, line: _Line) -> None:
        """A connection a statement failed on is never used again (it may be mid-operation)."""
        line.conn.terminate()
        self._open -= 1
        self._freed.set()


async def _sent(conn: asyncpg.Connection, sending: asyncio.Future[Any]) -> bool:
    """Whether the statement `sending` has just started on `conn` is now wholly in the kernel's hands
    (on its way to the database), seen within a few turns of the event loop: asyncpg counts a query
    once its Bind/Execute/Sync messages are written, and the transport holds nothing back. False
    (wait for the commit instead) when that cannot be seen."""
    driver: Any = conn  # asyncpg's protocol and transport are not part of its typed interface
    try:
        protocol = driver._protocol
        transport = driver._transport
        before = protocol.queries_count
    except AttributeError:  # another driver version: never release early
        return False
    for _ in range(3):
        await asyncio.sleep(0)  # the statement's task runs first: it was scheduled before
        if sending.done():
            return False  # committed already, or failed: its caller learns it the usual way
        if protocol.queries_count != before and transport.get_write_buffer_size() == 0:
            return True
    return False

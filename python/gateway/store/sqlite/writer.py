"""The SQLite store's writer: one thread per process that takes whatever has queued and commits it
as one transaction (group commit), each kind of item in its own savepoint so that one failing
cannot undo the others. Settlements and request log entries are queued with nobody waiting (a
settlement is journaled first); other writes are awaited operations."""

from __future__ import annotations

import asyncio
import logging
import queue
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from ...frozen import frozen
from ..log_backlog import MAX_LOG_BACKLOG_BYTES, LogBodyBacklog, body_bytes
from ..records import RequestLog, Settlement
from .ledger import _settle_many
from .rows import INSERT_LOG, _log_values, insert_rows

WriteOp = Callable[[sqlite3.Connection], Any]
log = logging.getLogger("gateway.store")
# How long the writer lets settlements gather before committing them (usage records appear this
# much later; charges are safe in the journal from the start). The writer shares the core with the
# event loop, so a request that arrives during a commit waits for it: while few requests run, a
# commit is kept short. While BUSY_REQUESTS or more run, each of them waits in line anyway and what
# counts is the writer's CPU per row: a commit rewrites every page it dirtied, and the log rows of
# a deployment's many keys and accounts land on different leaves of the log's indexes, so larger
# commits cost less per row (50 keys at c=64: +9 to +12 % requests/s with 50 ms instead of 10;
# benches/README, "many keys"). While few run, 5 ms rather than 10 halves what a request that meets
# a commit waits for: c=1 p99 0.91x, p50 1.00x (10 interleaved rounds). Every commit rewrites ~15
# pages whatever its size (~0.3 ms), so this costs ~15 us of CPU a request more at c=1.
SETTLEMENT_LINGER_SECONDS = 0.005
BUSY_LINGER_SECONDS = 0.05
BUSY_REQUESTS = 8
# Busy is judged on the most of the last few counts, one taken as each linger begins: a single
# count is often low at any load (under chat load at c=64, a quarter of them were 0: every request
# was in Granian's hands, read or being answered, at that instant).
LOAD_SAMPLES = 4
# Log bodies waiting past this end a linger early: a long linger must not push large bodies past
# the backlog's bound (dropped then, gateway.store.log_backlog).
LINGER_BODY_BYTES = MAX_LOG_BACKLOG_BYTES // 4
MAX_BATCH = 512  # items of one transaction

_STOP = object()


@frozen
class _Op:
    """An operation someone awaits: committed at once, its outcome set on `future`."""

    run: WriteOp
    future: asyncio.Future[Any]


@frozen
class _LogRow:
    """A request log entry's column values, written with the next group commit."""

    values: tuple[Any, ...]
    body_bytes: int  # counted in the backlog until written


class Writer:
    def __init__(self, owner: Callable[[], str | None], applied: Callable[[int], None]) -> None:
        """`owner()` names the process whose leases settlements spend; `applied(n)` is told when n
        more settlements are in the store (the journal may then be truncated)."""
        self._owner = owner
        self._applied = applied
        self.under_way: Callable[[], int] = lambda: 0  # requests running (Store.follow_load)
        self._load: deque[int] = deque(maxlen=LOAD_SAMPLES)  # its last counts
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._urgent = threading.Event()  # an awaited operation (or the stop) is queued
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._bodies = LogBodyBacklog()
        # Since when (monotonic) commits have been failing, and why; None while they succeed.
        self._failing_since: float | None = None
        self.last_error = ""

    @property
    def failing(self) -> float | None:
        """For how many seconds commits have been failing (None: they succeed)."""
        since = self._failing_since
        return None if since is None else time.monotonic() - since

    def start(self, conn: sqlite3.Connection, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(
            target=self._write_loop, args=(conn,), name="gateway-sqlite-writer", daemon=True
        )
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread is not None

    async def stop(self) -> None:
        """Commit what has queued, then end the thread."""
        if self._thread is not None:
            self._queue.put(_STOP)
            self._urgent.set()
            await asyncio.to_thread(self._thread.join)
            self._thread = None

    def settle(self, settlement: Settlement) -> None:
        """Queue a journaled settlement for the next group commit. Its log entry is written whole,
        bodies included (the journal keeps it without them), in the one row insert."""
        if settlement.log is not None:
            admitted = self._bodies.admit(settlement.log)[0]
            if admitted is not settlement.log:  # its bodies are dropped: the backlog is full
                settlement = replace(settlement, log=admitted)
        self._queue.put(settlement)
        self._commit_soon_if_heavy()

    def log(self, entry: RequestLog) -> None:
        """Queue a request log entry that no settlement carries for the next group commit."""
        entry, bodies = self._bodies.admit(entry)
        # Like a settlement, nobody waits for it: it joins the next group commit.
        self._queue.put(_LogRow(_log_values(entry), bodies))
        self._commit_soon_if_heavy()

    def _commit_soon_if_heavy(self) -> None:
        if self._bodies.waiting_bytes > LINGER_BODY_BYTES:
            self._urgent.set()  # ends the linger

    async def write(self, op: WriteOp, on_commit: Callable[[asyncio.Future[Any]], None] | None = None) -> Any:
        """Run `op` in the writer's next transaction and return its result once committed. With
        `on_commit`, the commit is seen through even when the caller is cancelled meanwhile (it
        commits regardless), and `on_commit(future)` runs when it is done."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if on_commit is not None:
            future.add_done_callback(on_commit)
        self._queue.put(_Op(op, future))
        self._urgent.set()  # committed at once, not at the end of a settlements' linger
        return await (asyncio.shield(future) if on_commit is not None else future)

    def _write_loop(self, conn: sqlite3.Connection) -> None:
        stop = False
        while not stop:
            batch = [self._queue.get()]
            # A journaled settlement is durable already and nobody awaits it: let more gather for a
            # moment so that one commit covers many, which keeps the writer's work (on the core the
            # event loop shares) off the request path. Anything awaited is committed at once: it
            # sets `_urgent`, which ends the linger. Settlements queued meanwhile do not wake this
            # thread (each wake-up is a GIL hand-off with the event loop): they are taken together
            # when the linger ends.
            if _nobody_waits(batch[0]):
                self._load.append(self.under_way())
                busy = max(self._load) >= BUSY_REQUESTS
                self._urgent.wait(BUSY_LINGER_SECONDS if busy else SETTLEMENT_LINGER_SECONDS)
            self._urgent.clear()
            while len(batch) < MAX_BATCH:
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

    def _commit_batch(self, conn: sqlite3.Connection, batch: list[Any]) -> None:
        """One transaction for the whole batch: the settlements together (a handful of statements
        for any number of them, their rows many to a statement, since every statement's step is a
        GIL hand-off with the event loop on the same core: rows.insert_rows), the request log
        entries the same way, then each awaited operation in its own savepoint (one failing fails
        alone). What was queued in the background is thus in place for every awaited operation of
        its batch."""
        settlements = [item for item in batch if isinstance(item, Settlement)]
        ops = [item for item in batch if isinstance(item, _Op)]
        logs = [item for item in batch if isinstance(item, _LogRow)]
        outcomes: list[tuple[asyncio.Future[Any], bool, Any]] = []
        settled: Exception | None = None
        logged: Exception | None = None
        try:
            conn.execute("BEGIN IMMEDIATE")
            if settlements:
                settled = _in_savepoint(conn, lambda: _settle_many(conn, settlements, self._owner()))
            if logs:
                logged = _in_savepoint(conn, lambda: _write_logs(conn, logs))
            for op in ops:
                outcomes.append((op.future, *_attempt(conn, op.run)))
            conn.execute("COMMIT")
            self._failing_since = None
        except sqlite3.Error as exc:
            if self._failing_since is None:
                self._failing_since = time.monotonic()
            self.last_error = str(exc)
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            outcomes = [(op.future, False, exc) for op in ops]
            settled = logged = exc
        # Written or dropped; a settlement queued again below counts its bodies again.
        self._bodies.release(
            sum(row.body_bytes for row in logs) + sum(body_bytes(s.log) for s in settlements if s.log)
        )
        if logged is not None:  # nobody to tell: the entries are lost, the requests are not
            log.error("writing %d request log entries failed: %s", len(logs), logged, exc_info=logged)
        if settlements and settled is None:
            self._applied(len(settlements))
        elif settlements:
            # A journaled settlement is never dropped: it stays in the journal and is tried again.
            log.error(
                "applying %d settlements failed, will retry: %s", len(settlements), settled, exc_info=settled
            )
            time.sleep(0.1)
            for settlement in settlements:
                self.settle(settlement)
        if self._loop is not None and outcomes:
            self._loop.call_soon_threadsafe(_resolve_all, outcomes)


def _write_logs(conn: sqlite3.Connection, logs: Sequence[_LogRow]) -> None:
    insert_rows(conn, INSERT_LOG, [row.values for row in logs])


def _nobody_waits(item: Any) -> bool:
    """True for a journaled settlement or a log entry (no future): its commit may wait for others."""
    return isinstance(item, Settlement | _LogRow)


def _in_savepoint(conn: sqlite3.Connection, work: Callable[[], Any]) -> Exception | None:
    """Run `work` so that its failure undoes it alone; returns the failure."""
    ok, value = _attempt(conn, lambda _: work())
    return None if ok else value


def _attempt(conn: sqlite3.Connection, op: WriteOp) -> tuple[bool, Any]:
    conn.execute("SAVEPOINT item")
    try:
        result = op(conn)
    except Exception as exc:
        if not conn.in_transaction:
            # SQLite rolled the whole transaction back (a full disk, an I/O error): the batch fails,
            # with this cause (not "no such savepoint"), and its settlements are tried again.
            raise
        conn.execute("ROLLBACK TO item")
        conn.execute("RELEASE item")
        return False, exc
    conn.execute("RELEASE item")
    return True, result


def _resolve_all(outcomes: list[tuple[Any, bool, Any]]) -> None:
    for future, ok, value in outcomes:
        if future is None or future.done():
            continue
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)

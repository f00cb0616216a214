"""The settlement journal: how a charge survives a killed process without the response waiting on
a database commit.

Each settlement is appended to this process's journal with one write(2) before the response goes
out (made with the GIL held: core.AppendFile): the usage record and the request's log entry
(without its bodies) on one line, so that a charge and the records that show it are one durable
step; whatever is replayed, all of them are. No fsync: a killed process cannot lose what the kernel
already holds (a power cut can; that is the same promise as SQLite's synchronous=NORMAL). A request
with an Idempotency-Key puts the answer its key keeps on its charge's line: a replay keeps it too, so
a retry after the kill replays the answer instead of running, and being charged, again. The store
applies settlements in batches off the request path and truncates the journal whenever everything
written has been applied.

A stream still running also appends its progress now and again (routes/streaming.py): the
settlement it would have if it ended there, marked as progress. Progress is never applied while its
process lives; a replay applies the last progress of a stream whose final settlement never came, so
a killed process's streams are billed what they had delivered, up to the last progress line.

Every live process holds an exclusive flock on its own journal. At start-up, and then now and
again, a process replays every journal whose lock it can take (its owner is dead) and deletes it;
replay is idempotent because a settlement is keyed by its usage id. The journal's name is also the
process's name on its leases (gateway.funds): a dead owner's leases are returned with its replay.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson

from ...core import AppendFile
from ..records import LOG_BODY_COLUMNS, LOG_COLUMNS, KeptAnswer, RequestLog, Settlement, StoredAnswer
from .rows import usage_record, usage_row

PREFIX = "settlements-"
SUFFIX = ".jsonl"
# A journal is made under a staging name (Journal.__init__), empty, then renamed. A process killed
# in between leaves the empty staging file behind; it is removed once unlocked and this old (its
# maker locks it microseconds after creating it, so an unlocked one this old has no owner).
STAGING_GRACE_SECONDS = 60.0


def staging_name(name: str) -> str:
    """The name a journal called `name` is made under (a glob of journal names gives theirs)."""
    return f".{name}.new"


STAGING_PATTERN = staging_name(PREFIX + "*" + SUFFIX)

# The request log fields a journal line keeps (bodies are not money: they are not journaled).
_LOG_FIELDS = tuple(c for c in LOG_COLUMNS if c not in LOG_BODY_COLUMNS)


def encode(settlement: Settlement, *, progress: bool = False) -> bytes:
    log = settlement.log
    line: dict[str, Any] = {"u": usage_row(settlement.record), "l": None if log is None else _log_head(log)}
    if progress:
        line["p"] = 1
    if settlement.answer is not None:
        line["a"] = _answer_row(settlement.answer)
    return orjson.dumps(line) + b"\n"


def _answer_row(kept: KeptAnswer) -> tuple[Any, ...]:
    """An Idempotency-Key's answer on its charge's line (its body base64, as JSON has no bytes)."""
    answer = kept.answer
    body = base64.b64encode(answer.body).decode()
    return (
        kept.key_id,
        kept.idempotency_key,
        kept.fingerprint,
        answer.status,
        answer.headers,
        body,
        kept.expires_at_ms,
    )


def _kept_answer(row: list[Any]) -> KeptAnswer:
    key_id, idempotency_key, fingerprint, status, headers, body, expires_at_ms = row
    answer = StoredAnswer(status, tuple((str(k), str(v)) for k, v in headers), base64.b64decode(body))
    return KeptAnswer(key_id, idempotency_key, fingerprint, answer, expires_at_ms)


def _log_head(log: RequestLog) -> tuple[Any, ...]:
    """The entry's fields but its bodies, in _LOG_FIELDS order (money as decimal text); written out
    rather than read by name in a loop, since every settlement is encoded on the request path."""
    return (
        log.id,
        log.key_id,
        log.account_id,
        log.method,
        log.path,
        log.model,
        log.status,
        log.error_code,
        log.started_at_ms,
        log.duration_ms,
        None if log.cost is None else str(log.cost),
        log.usage_id,
        log.attempts,
        log.request_bytes,
        log.response_bytes,
    )


def decode(line: bytes) -> tuple[Settlement, bool]:
    """A journal line: the settlement and whether it is a stream's progress rather than its end."""
    data = orjson.loads(line)
    if isinstance(data, list):  # a line written before log entries were journaled with charges
        return Settlement(usage_record(data)), False
    head = data.get("l")
    log = None
    if head is not None:
        fields = dict(zip(_LOG_FIELDS, head, strict=True))
        cost = fields.pop("cost")
        log = RequestLog(
            **fields,
            cost=None if cost is None else Decimal(cost),
            request_body=None,
            response_body=None,
        )
    answer = data.get("a")
    kept = None if answer is None else _kept_answer(answer)
    return Settlement(usage_record(data["u"]), log, kept), bool(data.get("p"))


class Journal:
    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"{PREFIX}{os.getpid()}-{os.urandom(4).hex()}{SUFFIX}"
        self.owner = owner_of(self.path)
        # Locked for as long as this process lives; written with the GIL held (see AppendFile).
        # Created and locked under a name no other process reads, then renamed into place: a file
        # seen under a journal's name unlocked is a dead owner's, so another process's replay
        # (`orphans`) or count (`live_count`) that met it between its creation and its lock would
        # take its lock first, and this process could not start.
        staging = directory / staging_name(self.path.name)
        self._file = AppendFile(staging)
        os.rename(staging, self.path)  # the lock is the open file's: it holds under the new name
        self._lock = threading.Lock()
        self._written = 0
        self._applied = 0
        # The latest progress line of each stream still running, by usage id: written again after
        # a truncation, so that a stream's progress is always in the file until it ends.
        self._running: dict[str, bytes] = {}

    def append(self, settlement: Settlement) -> None:
        """Write the settlement's line. It is counted as written even when the write fails (a full
        disk: OSError), since the store is handed it all the same, so that the file is emptied once
        the store has applied everything."""
        line = encode(settlement)
        with self._lock:
            try:
                self._file.append(line)
            finally:
                self._written += 1
                self._running.pop(settlement.record.id, None)

    def progress(self, settlement: Settlement) -> None:
        """A running stream's settlement so far: replayed only if its process dies before it ends."""
        line = encode(settlement, progress=True)
        with self._lock:
            self._file.append(line)
            self._running[settlement.record.id] = line

    def forget(self, usage_id: str) -> None:
        """A stream that noted progress ended without a settlement (nothing is billed)."""
        with self._lock:
            self._running.pop(usage_id, None)

    def applied(self, count: int) -> None:
        """`count` more settlements are in the store; when all written ones are, start afresh."""
        with self._lock:
            self._applied += count
            if self._applied == self._written:
                self._file.truncate()
                if self._running:
                    self._file.append(b"".join(self._running.values()))

    def close(self) -> None:
        """Close; the file goes only when everything in it was applied (else the next start replays it)."""
        with self._lock:
            caught_up = self._applied == self._written and not self._running
            self._file.close()
        if caught_up:
            self.path.unlink(missing_ok=True)


def owner_of(path: Path) -> str:
    return path.name.removesuffix(SUFFIX)


def _journals(directory: Path) -> list[Path]:
    return sorted(directory.glob(PREFIX + "*" + SUFFIX)) if directory.is_dir() else []


def live_count(directory: Path) -> int:
    """How many processes sharing the store are alive: the journals whose lock is held."""
    alive = 0
    for path in _journals(directory):
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            alive += 1
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
    return alive


def owners(directory: Path) -> set[str]:
    """Every process that has a journal here, alive or dead and not yet replayed."""
    return {owner_of(path) for path in _journals(directory)}


@dataclass(slots=True)
class Orphan:
    """The journal of a dead process: its name and the settlements to apply (each stream's last
    progress stands for a settlement that never came)."""

    owner: str
    settlements: list[Settlement]


def read_settlements(lines: Iterator[bytes]) -> list[Settlement]:
    """A journal's settlements, with the last progress of each stream that did not end."""
    ended: dict[str, Settlement] = {}
    progress: dict[str, Settlement] = {}
    for line in lines:
        if not line.endswith(b"\n"):  # a line cut short by a crash was never acknowledged
            continue
        settlement, is_progress = decode(line)
        (progress if is_progress else ended)[settlement.record.id] = settlement
    return [*ended.values(), *(s for usage_id, s in progress.items() if usage_id not in ended)]


def remove_dead_staging(directory: Path) -> int:
    """Remove the staging files of journals whose makers died before renaming them (always empty:
    nothing is appended before the rename). Returns how many were removed."""
    if not directory.is_dir():
        return 0
    cutoff = time.time() - STAGING_GRACE_SECONDS
    removed = 0
    for path in directory.glob(STAGING_PATTERN):
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            if os.fstat(fd).st_mtime > cutoff:
                continue  # its maker may not have locked it yet
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # its maker is alive (and about to rename it)
            continue
        finally:
            os.close(fd)
        path.unlink(missing_ok=True)
        removed += 1
    return removed


@contextlib.contextmanager
def orphans(directory: Path) -> Iterator[list[Orphan]]:
    """The journals of dead processes. Deleted after the block, if it succeeds."""
    held: list[tuple[int, Path]] = []
    found: list[Orphan] = []
    remove_dead_staging(directory)
    try:
        for path in _journals(directory):
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # its process is alive
                os.close(fd)
                continue
            held.append((fd, path))
            with open(fd, "rb", closefd=False) as f:
                found.append(Orphan(owner_of(path), read_settlements(iter(f))))
        yield found
        for _, path in held:
            path.unlink(missing_ok=True)
    finally:
        for fd, _ in held:
            os.close(fd)

"""The settlement journal: how a charge survives a killed process without the response waiting on
a database commit.

Each settlement is appended to this process's journal with one write(2) before the response goes
out. No fsync: a killed process cannot lose what the kernel already holds (a power cut can; that is
the same promise as SQLite's synchronous=NORMAL). The store applies settlements in batches off the
request path and truncates the journal whenever everything written has been applied.

Every live process holds an exclusive flock on its own journal. At start-up, and then now and
again, a process replays every journal whose lock it can take (its owner is dead) and deletes it;
replay is idempotent because a settlement is keyed by its usage id. The journal's name is also the
process's name on its leases (gateway.funds): a dead owner's leases are returned with its replay.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson

from .base import UsageRecord

PREFIX = "settlements-"
SUFFIX = ".jsonl"


def encode(r: UsageRecord) -> bytes:
    return orjson.dumps(r.as_row()) + b"\n"


def decode(line: bytes) -> UsageRecord:
    return UsageRecord.from_row(orjson.loads(line))


class Journal:
    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"{PREFIX}{os.getpid()}-{os.urandom(4).hex()}{SUFFIX}"
        self.owner = owner_of(self.path)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self._lock = threading.Lock()
        self._written = 0
        self._applied = 0

    def append(self, record: UsageRecord) -> None:
        line = encode(record)
        with self._lock:
            os.write(self._fd, line)
            self._written += 1

    def applied(self, count: int) -> None:
        """`count` more settlements are in the store; when all written ones are, start afresh."""
        with self._lock:
            self._applied += count
            if self._applied == self._written:
                os.ftruncate(self._fd, 0)

    def close(self) -> None:
        """Close; the file goes only when everything in it was applied (else the next start replays it)."""
        with self._lock:
            caught_up = self._applied == self._written
            os.close(self._fd)
        if caught_up:
            self.path.unlink(missing_ok=True)


def owner_of(path: Path) -> str:
    return path.name.removesuffix(SUFFIX)


def _journals(directory: Path) -> list[Path]:
    return sorted(directory.glob(PREFIX + "*" + SUFFIX)) if directory.is_dir() else []


def owners(directory: Path) -> set[str]:
    """Every process that has a journal here, alive or dead and not yet replayed."""
    return {owner_of(path) for path in _journals(directory)}


@dataclass(slots=True)
class Orphan:
    """The journal of a dead process: its name and the settlements it holds."""

    owner: str
    records: list[UsageRecord]


@contextlib.contextmanager
def orphans(directory: Path) -> Iterator[list[Orphan]]:
    """The journals of dead processes. Deleted after the block, if it succeeds."""
    held: list[tuple[int, Path]] = []
    found: list[Orphan] = []
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
            orphan = Orphan(owner_of(path), [])
            with open(fd, "rb", closefd=False) as f:
                for line in f:
                    if line.endswith(b"\n"):  # a line cut short by a crash was never acknowledged
                        orphan.records.append(decode(line))
            found.append(orphan)
        yield found
        for _, path in held:
            path.unlink(missing_ok=True)
    finally:
        for fd, _ in held:
            os.close(fd)

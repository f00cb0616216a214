"""Key lookups cached per process, invalidated across processes by a generation counter.

Authentication runs on every request; a database read there costs little on a quiet store and much
more while a writer commits. So each process keeps the keys it has seen, and every change to a key
or an account (delete, rotate, new limits, allowed models) makes every process forget them all:
the change adds one to a counter in the generation file after its commit, and a lookup compares
the counter with the one its cached entries were read under. A deleted key therefore stops working
at the next request, in every process.

Every process maps the file's first 8 bytes (a little-endian count) into its memory, shared, so a
lookup reads the counter without a system call: the stat of a file whose length was the count (the
previous scheme) took 7 µs a request in a loaded worker, 17 µs before a stream's first token. A
change takes the file's lock (flock) to add one, so two processes changing keys at once both count.

Versions before this one counted by appending a byte and read the file's length. A rolling restart
after an upgrade (SIGHUP, docs/operations.md) runs workers of both for a moment, so a change still
appends its byte too (the earlier workers see it), and a lookup reads the length at most once a
second as well (a change an earlier worker made reaches this one within that second).

A read may see the counter half-written by another process: the value then differs from both the
old and the new one, and the cache is dropped once more than it needed to be; never less.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
import time
from pathlib import Path

from ...core import file_len
from ..records import KeyContext

# Past this many keys the cache starts again empty: memory stays bounded whatever the key count.
MAX_CACHED_KEYS = 100_000
_COUNTER = struct.Struct("<Q")
# How often a lookup also reads the file's length, the signal of a worker of an earlier version.
LENGTH_CHECK_SECONDS = 1.0


class KeyCache:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._counter: mmap.mmap | None = None
        self._generation = -1
        self._entries: dict[bytes, KeyContext] = {}
        self._length = 0  # the file's length when last read
        self._length_due = 0.0  # when to read it again (monotonic seconds)

    def open(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            with _locked(fd):
                if os.fstat(fd).st_size < _COUNTER.size:  # new (or an earlier version's, short)
                    os.ftruncate(fd, _COUNTER.size)
            self._counter = mmap.mmap(fd, _COUNTER.size)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def close(self) -> None:
        if self._counter is not None:
            self._counter.close()
            self._counter = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._entries.clear()

    def generation(self) -> int:
        """Read before looking a key up in the database, then passed to get and put: the counter,
        and the file's length above it."""
        if self._counter is None:
            raise RuntimeError("key cache is not open")
        now = time.monotonic()
        if now >= self._length_due:
            self._length_due = now + LENGTH_CHECK_SECONDS
            self._length = file_len(self.path)
        count: int = _COUNTER.unpack_from(self._counter)[0]
        return self._length << 64 | count

    def get(self, key_hash: bytes, generation: int) -> KeyContext | None:
        if generation != self._generation:
            self._entries.clear()
            self._generation = generation
            return None
        return self._entries.get(key_hash)

    def put(self, key_hash: bytes, ctx: KeyContext, generation: int) -> None:
        if generation != self._generation:
            return  # read under an older generation: may be stale already
        if len(self._entries) >= MAX_CACHED_KEYS:
            self._entries.clear()
        self._entries[key_hash] = ctx

    def changed(self) -> None:
        """After a change to keys or accounts has committed: every process forgets its cache."""
        if self._fd is None or self._counter is None:
            raise RuntimeError("key cache is not open")
        with _locked(self._fd):
            count = _COUNTER.unpack_from(self._counter)[0]
            _COUNTER.pack_into(self._counter, 0, (count + 1) % (1 << 64))
            os.write(self._fd, b".")  # for a worker of an earlier version (see above)


class _locked:
    """The generation file's exclusive lock (released by the kernel if the process dies)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def __enter__(self) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def __exit__(self, *_: object) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)

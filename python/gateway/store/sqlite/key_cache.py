"""Key lookups cached per process, invalidated across processes by a generation file.

Authentication runs on every request; a database read there costs little on a quiet store and much
more while a writer commits. So each process keeps the keys it has seen, and every change to a key
or an account (delete, rotate, new limits, allowed models) makes every process forget them all:
the change appends one byte to the generation file after its commit, and a lookup compares the
file's size (one stat call, made with the GIL held) with the size its cached entries were read
under. Appends with O_APPEND never lose a concurrent one, so two processes changing keys at once
both move the generation on. A deleted key therefore stops working at the next request, in every
process.
"""

from __future__ import annotations

import os
from pathlib import Path

from ...core import file_len
from ..records import KeyContext

# Past this many keys the cache starts again empty: memory stays bounded whatever the key count.
MAX_CACHED_KEYS = 100_000


class KeyCache:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._generation = -1
        self._entries: dict[bytes, KeyContext] = {}

    def open(self) -> None:
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._entries.clear()

    def generation(self) -> int:
        """Read before looking a key up in the database, then passed to get and put (a stat that
        keeps the GIL: see AppendFile)."""
        return file_len(self.path)

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
        if self._fd is None:
            raise RuntimeError("key cache is not open")
        os.write(self._fd, b".")

"""Key lookups cached per process, invalidated across processes and instances within a second.

Authentication runs on every request, so each process keeps the keys it has seen (with their
accounts). Every change to a key or an account (delete, rotate, new limits, allowed models) bumps
`key_generation` and sends `NOTIFY gateway_keys` in its own transaction; PostgreSQL delivers the
notification at commit to every process, each of which LISTENs on a dedicated connection and then
forgets its whole cache (the process that made the change forgets it at once, after its commit).
If the listening connection drops, notifications sent meanwhile are lost: the process then forgets
its cache on reconnecting, and until it has reconnected reads `key_generation` every second through
the pool, forgetting its cache whenever it moved. Either way a change reaches every process within
about a second. An entry read while a change was committing is not kept (see `put`).
"""

from __future__ import annotations

from .. import KeyContext

# Past this many keys the cache starts again empty: memory stays bounded whatever the key count.
MAX_CACHED_KEYS = 100_000
CHANNEL = "gateway_keys"


class KeyCache:
    def __init__(self) -> None:
        self.generation = 0  # this process's count of invalidations
        self.seen: int | None = None  # the latest key_generation read from the database
        self._entries: dict[bytes, KeyContext] = {}

    def get(self, key_hash: bytes) -> KeyContext | None:
        return self._entries.get(key_hash)

    def put(self, key_hash: bytes, ctx: KeyContext, generation: int) -> None:
        """Keep an entry read after `generation` was current; dropped when an invalidation came
        meanwhile (it may be stale already)."""
        if generation != self.generation:
            return
        if len(self._entries) >= MAX_CACHED_KEYS:
            self._entries.clear()
        self._entries[key_hash] = ctx

    def invalidate(self) -> None:
        self.generation += 1
        self._entries.clear()

    def observe(self, db_generation: int) -> None:
        """The database's key_generation as just read: forget everything if it moved."""
        if self.seen is not None and db_generation != self.seen:
            self.invalidate()
        self.seen = db_generation

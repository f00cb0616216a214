"""Where the token buckets of the rate limits live (gateway.ratelimits): one interface, two stores.

- `FileBuckets`: the embedded mode. The Rust core's `SharedBuckets`, a small file next to the
  SQLite database updated under its lock, shared by the worker processes of one machine.
- `gateway.redis_buckets.RedisBuckets`: many instances. One Lua script in Redis per operation,
  atomic, with the same arithmetic as the Rust core (tests/gateway/test_redis_buckets.py runs
  both on random sequences and requires identical answers).

A bucket is named by `key` and behaves as the Rust core's `TokenBucket(capacity, refill_tokens,
refill_period_ns, now)`: it starts full, refills `refill_tokens` every `refill_period_ns`
continuously, in exact integer arithmetic; under a changed capacity the level moves by the change,
up or down (what was taken stays taken), and a bucket whose period changed starts full. Times are
nanoseconds of the wall clock; `now_ns=None` means the store's own clock (this machine's for the
file, the Redis server's for Redis). Time going backwards counts as no time.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Protocol

from .core import SharedBuckets


class BucketsUnavailable(OSError):
    """The store of the buckets cannot be reached (Redis down or unreachable). An OSError, like the
    file store's own failures, so one `except OSError` covers both."""


class Taken(Protocol):
    """What `try_take` answers (the Rust core's TakeResult is one)."""

    @property
    def allowed(self) -> bool: ...
    @property
    def remaining(self) -> int:
        """Whole tokens left after the call (0 while in debt)."""

    @property
    def retry_after_ns(self) -> int:
        """0 when allowed; else nanoseconds until the tokens asked for would be there (until the
        bucket is full when more than its capacity was asked for)."""


class BucketStore(Protocol):
    """The three operations on a bucket. Each is atomic: concurrent callers, in any process of any
    instance sharing the store, see one order. Raise OSError (BucketsUnavailable for Redis) when
    the store cannot be used, CoreError (a ValueError) for an invalid limit: refill_tokens or
    refill_period_ns of 0, or capacity * refill_period_ns of 2**125 or more; OverflowError for a
    number outside u64 (i64 for delta)."""

    async def try_take(
        self, key: str, capacity: int, refill_tokens: int, refill_period_ns: int, n: int, now_ns: int | None
    ) -> Taken:
        """Take `n` tokens if the bucket holds them."""

    async def available(
        self, key: str, capacity: int, refill_tokens: int, refill_period_ns: int, now_ns: int | None
    ) -> int:
        """The whole tokens the bucket holds now."""

    async def adjust(
        self,
        key: str,
        capacity: int,
        refill_tokens: int,
        refill_period_ns: int,
        delta: int,
        now_ns: int | None,
    ) -> int:
        """Correct a reservation: a positive delta gives tokens back (never above capacity), a
        negative one takes more (the bucket may go into debt). Returns the whole tokens left."""


# Slots in the file's table: two per key in use (a few MB of sparse file at most).
SLOTS = 65_536


class FileBuckets:
    """The embedded store: the Rust core's SharedBuckets at `path`. Its calls take microseconds
    (the page cache, a file lock) and run on the calling thread; the `*_now` forms are the same
    operations without a coroutine, for callers that cannot await."""

    def __init__(self, path: Path, slots: int = SLOTS) -> None:
        self._table = SharedBuckets(path, slots)

    async def try_take(
        self, key: str, capacity: int, refill_tokens: int, refill_period_ns: int, n: int, now_ns: int | None
    ) -> Taken:
        now = time.time_ns() if now_ns is None else now_ns
        return self._table.try_take(key, capacity, refill_tokens, refill_period_ns, n, now)

    async def available(
        self, key: str, capacity: int, refill_tokens: int, refill_period_ns: int, now_ns: int | None
    ) -> int:
        now = time.time_ns() if now_ns is None else now_ns
        return self._table.available(key, capacity, refill_tokens, refill_period_ns, now)

    async def adjust(
        self,
        key: str,
        capacity: int,
        refill_tokens: int,
        refill_period_ns: int,
        delta: int,
        now_ns: int | None,
    ) -> int:
        return self.adjust_now(key, capacity, refill_tokens, refill_period_ns, delta, now_ns)

    def adjust_now(
        self,
        key: str,
        capacity: int,
        refill_tokens: int,
        refill_period_ns: int,
        delta: int,
        now_ns: int | None,
    ) -> int:
        now = time.time_ns() if now_ns is None else now_ns
        return self._table.adjust(key, capacity, refill_tokens, refill_period_ns, delta, now)

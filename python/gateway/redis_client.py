"""The one way the gateway talks to Redis: `connect(url)` gives a client with its own connection pool.

Each worker process makes one (in the application's lifespan) and closes it at shutdown; every
part that keeps shared state in Redis (rate-limit buckets, channel state, key-change notices)
takes that client rather than opening its own.

Calls fail fast: a Redis that is down or unreachable must not hold requests. A connection is
given SOCKET_TIMEOUT to open and each reply as long to come. A call whose connection broke is tried
once more, at once, on a fresh connection (a pooled connection broken by a Redis restart is only
noticed on its next use); a call that timed out is not (it may have run: a script must not run
twice). Then its error is raised (see `UNAVAILABLE`). Nothing needs restarting when Redis comes
back: the next call connects again.
"""

from __future__ import annotations

from typing import Final

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError
from redis.exceptions import TimeoutError as RedisTimeoutError

# Seconds to connect, and to wait for each reply: a Redis on the same network answers in well
# under a millisecond, so half a second means it is gone (or stalled), not slow.
SOCKET_TIMEOUT: Final = 0.5

# The errors that mean "Redis cannot be used right now" (down, unreachable, loading its data, a
# replica after a failover), as opposed to a mistake of the caller's: callers turn these into
# their documented fault behaviour.
UNAVAILABLE: Final = (RedisConnectionError, RedisTimeoutError, ReadOnlyError, OSError, TimeoutError)


def connect(url: str) -> Redis:
    """A client for `url` (redis://, rediss:// or unix://, as in the [redis] section). No I/O
    happens here: connections are opened by the first calls. Close it with `await client.aclose()`."""
    return Redis.from_url(
        url,
        socket_timeout=SOCKET_TIMEOUT,
        socket_connect_timeout=SOCKET_TIMEOUT,
        retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
    )

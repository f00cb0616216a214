"""Channel concurrency caps and circuit breakers shared by every gateway instance through Redis.

With `[redis] url` set, the router (gateway.routing) keeps what matters for sending a request
somewhere in Redis instead of each worker's memory, so that N instances of M workers behave as one:

- A channel's `max_concurrency` is one cap for the whole deployment: a sorted set of slot leases
  (member: one attempt, score: when its lease runs out, on Redis's clock). Taking a slot is one Lua
  script (drop the expired leases, count, add); the request gives it back when it is done with the
  channel (a stream when it ends). Each process renews its leases every RENEW_SECONDS, so a process
  killed with its slots held (kill -9, a lost machine) has them back in the pool within
  LEASE_SECONDS. A plain INCR counter would keep them forever.
- The circuit breaker is one hash per channel: consecutive failures (`fails`, counted across every
  instance: "N in a row" means N attempts of the deployment), `tripped` with `cool_until`, the
  half-open probe lease (`probe`, `probe_until`, renewed like a slot, so only one probe runs in the
  whole deployment), and `busy_until` after an upstream 429. Deadlines are on Redis's clock, so the
  instances' clocks do not matter; the hash expires a day after its last change.
- A channel without a cap that this process saw healthy less than FRESH_SECONDS ago is used without
  asking Redis: a cool-down decided elsewhere reaches this process within that time (any capped
  channel asks every time, since its cap is counted there).

Redis unreachable (an error or no answer within OP_TIMEOUT_SECONDS): routing falls back to each
process's own view, the state it last saw from Redis included (caps split by the local workers,
local breakers), with one warning in the log; a background ping every RECONNECT_SECONDS brings it
back to the shared state as soon as Redis answers, without a restart. Caps are capacity, not money:
the fallback may let a channel take more than its cap for a while, never spend a balance twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import socket
import uuid
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeVar

from .deadline import within
from .frozen import frozen
from .redis_client import UNAVAILABLE
from .redis_protocol import ReplyError

if TYPE_CHECKING:
    from .redis_client import RedisClient, Script

log = logging.getLogger("gateway.routing")
T = TypeVar("T")

# How long a slot or probe lease lives without renewal: the bound on a dead process's slots.
LEASE_SECONDS: Final = 10.0
# How often a process renews the leases it holds.
RENEW_SECONDS: Final = 3.0
# The longest one Redis call may take before routing falls back to the local view.
OP_TIMEOUT_SECONDS: Final = 0.5
# How often an unreachable Redis is asked whether it is back.
RECONNECT_SECONDS: Final = 1.0
# How long the shared state seen for an uncapped channel is trusted without asking again.
FRESH_SECONDS: Final = 1.0
# A breaker hash outlives its last change by this much (a channel removed from the settings).
STATE_TTL_MS: Final = 86_400_000
KEY_PREFIX: Final = "gateway:channel:"

# Every script starts from Redis's own clock, in milliseconds.
_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# What each script answers about the channel: tripped (0/1), then the milliseconds left of the
# cool-down, of the busy mark, the consecutive failures, and the ms left of a probe under way.
_STATE = """
local function state(key)
  local h = redis.call('HMGET', key, 'tripped', 'cool_until', 'busy_until', 'fails', 'probe_until')
  return {h[1] == '1' and 1 or 0, math.max((tonumber(h[2]) or 0) - now, 0),
          math.max((tonumber(h[3]) or 0) - now, 0), tonumber(h[4]) or 0,
          math.max((tonumber(h[5]) or 0) - now, 0)}
end
"""

# KEYS: breaker hash, slots zset. ARGV: cap (0: none), lease ms, member, pinned (0/1).
# Answers {granted (0/1), reason, probe (0/1), in flight, state...}.
_ACQUIRE = (
    _NOW
    + _STATE
    + """
local cap, lease, member = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local s = state(KEYS[1])
local function answer(granted, reason, probe, in_flight)
  return {granted, reason, probe, in_flight, s[1], s[2], s[3], s[4], s[5]}
end
local in_flight = 0
if cap > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  in_flight = redis.call('ZCARD', KEYS[2])
  if in_flight >= cap then return answer(0, 'full', 0, in_flight) end
end
-- A pinned request (its state lives here) passes a busy mark and a cooling breaker alike.
if s[3] > 0 and ARGV[4] ~= '1' then return answer(0, 'busy', 0, in_flight) end
local probe = 0
if s[1] == 1 then
  if ARGV[4] ~= '1' then
    if s[2] > 0 then return answer(0, 'cooling', 0, in_flight) end
    if s[5] > 0 then return answer(0, 'probing', 0, in_flight) end
  end
  probe = 1
  redis.call('HSET', KEYS[1], 'probe', member, 'probe_until', now + lease)
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
  s[5] = lease
end
if cap > 0 then
  redis.call('ZADD', KEYS[2], now + lease, member)
  redis.call('PEXPIRE', KEYS[2], lease)
  in_flight = in_flight + 1
end
return answer(1, 'ok', probe, in_flight)
"""
)

# KEYS: breaker hash, slots zset, then the breaker hashes of the model's other channels.
# ARGV: member, kind ("busy": an upstream 429; "fail"), busy ms, failures to cool down, cool-down
# ms, was a probe (0/1), hash ttl ms. The attempt's slot goes back in the same call.
_FAILED = (
    _NOW
    + _STATE
    + """
redis.call('ZREM', KEYS[2], ARGV[1])
-- Traffic is only ever turned away from a channel that another one can take it from.
local others = false
for i = 3, #KEYS do
  local o = redis.call('HMGET', KEYS[i], 'tripped', 'busy_until')
  if o[1] ~= '1' and (tonumber(o[2]) or 0) <= now then
    others = true
    break
  end
end
if redis.call('HGET', KEYS[1], 'probe') == ARGV[1] then
  redis.call('HDEL', KEYS[1], 'probe', 'probe_until')
end
if ARGV[2] == 'busy' then
  if others then redis.call('HSET', KEYS[1], 'busy_until', now + tonumber(ARGV[3])) end
else
  local fails = redis.call('HINCRBY', KEYS[1], 'fails', 1)
  if (ARGV[6] == '1' or fails >= tonumber(ARGV[4])) and others then
    redis.call('HSET', KEYS[1], 'tripped', 1, 'cool_until', now + tonumber(ARGV[5]))
  else
    redis.call('HSET', KEYS[1], 'tripped', 0)
  end
end
redis.call('PEXPIRE', KEYS[1], ARGV[7])
return state(KEYS[1])
"""
)

# KEYS: breaker hash. ARGV: hash ttl ms. The channel answered: the breaker closes.
_ANSWERED = """
redis.call('HSET', KEYS[1], 'fails', 0, 'tripped', 0)
redis.call('HDEL', KEYS[1], 'probe', 'probe_until')
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
"""

# KEYS: breaker hash, slots zset. ARGV: member. The slot goes back; a probe that never ended
# (the request was cancelled) lets another probe go.
_RELEASE = """
redis.call('ZREM', KEYS[2], ARGV[1])
if redis.call('HGET', KEYS[1], 'probe') == ARGV[1] then
  redis.call('HDEL', KEYS[1], 'probe', 'probe_until')
end
return 1
"""

# KEYS: breaker hash, slots zset. ARGV: lease ms, then the members this process holds there.
# A lease that already ran out stays out: its slot may have been taken since.
_RENEW = (
    _NOW
    + """
local lease = tonumber(ARGV[1])
local probe = redis.call('HGET', KEYS[1], 'probe')
local renewed = 0
for i = 2, #ARGV do
  local score = redis.call('ZSCORE', KEYS[2], ARGV[i])
  if score and tonumber(score) > now then
    redis.call('ZADD', KEYS[2], 'XX', now + lease, ARGV[i])
    renewed = renewed + 1
  end
  if probe == ARGV[i] then redis.call('HSET', KEYS[1], 'probe_until', now + lease) end
end
if renewed > 0 then redis.call('PEXPIRE', KEYS[2], lease) end
return renewed
"""
)

# KEYS: pairs of (breaker hash, slots zset). Answers, per pair, the state and then the slots held.
_READ = (
    _NOW
    + _STATE
    + """
local out = {}
for i = 1, #KEYS, 2 do
  local s = state(KEYS[i])
  s[6] = redis.call('ZCOUNT', KEYS[i + 1], '(' .. now, '+inf')
  out[#out + 1] = s
end
return out
"""
)


@frozen
class SharedState:
    """A channel's breaker as Redis answered it (durations in seconds from the answer)."""

    tripped: bool
    cool_left: float
    busy_left: float
    fails: int
    probe_left: float

    @classmethod
    def parse(cls, raw: Sequence[Any]) -> SharedState:
        return cls(raw[0] == 1, raw[1] / 1000, raw[2] / 1000, int(raw[3]), raw[4] / 1000)


@dataclass(slots=True)
class Lease:
    """One attempt's hold on a channel in Redis: a slot of its cap (`slots_key` set) and/or the
    half-open probe."""

    hash_key: str
    slots_key: str
    member: str
    capped: bool
    probe: bool = False
    trouble: bool = False  # the breaker showed failures: an answer is reported to close it

    @property
    def held(self) -> bool:
        """Whether Redis holds something of this lease that must be given back or renewed."""
        return self.capped or self.probe


@frozen
class Acquired:
    lease: Lease | None  # None: refused
    reason: str  # "ok", or why not: "full", "busy", "cooling", "probing"
    in_flight: int
    state: SharedState


class Unavailable(Exception):
    """Redis did not answer in time or failed: route on the local view."""


class SharedChannels:
    """Channel slots and breakers in Redis, for one worker process (its event loop), on the
    process's one client (gateway.redis_client)."""

    def __init__(
        self,
        redis: RedisClient,
        prefix: str = KEY_PREFIX,
        lease_seconds: float = LEASE_SECONDS,
        renew_seconds: float = RENEW_SECONDS,
        op_timeout: float = OP_TIMEOUT_SECONDS,
        reconnect_seconds: float = RECONNECT_SECONDS,
    ) -> None:
        self.redis = redis
        self.prefix = prefix
        self.up = True
        self._errors = (*UNAVAILABLE, ReplyError)
        self._lease_ms = max(1, int(lease_seconds * 1000))
        self._renew_seconds = renew_seconds
        self._op_timeout = op_timeout
        self._reconnect_seconds = reconnect_seconds
        self._owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}:"
        self._ids = itertools.count()
        self._acquire = redis.register_script(_ACQUIRE)
        self._failed = redis.register_script(_FAILED)
        self._answered = redis.register_script(_ANSWERED)
        self._release = redis.register_script(_RELEASE)
        self._renew = redis.register_script(_RENEW)
        self._read = redis.register_script(_READ)
        self._held: dict[str, Lease] = {}  # by member: what the renewal keeps alive
        self._tasks: set[asyncio.Task[Any]] = set()
        self._renewer: asyncio.Task[None] | None = None
        self._reconnect: asyncio.Task[None] | None = None

    def keys(self, model: str, channel: str) -> tuple[str, str]:
        """The breaker hash and the slots zset of one channel."""
        base = f"{self.prefix}{model}|{channel}"
        return base, base + ":slots"

    def lease(self, keys: tuple[str, str], capped: bool, trouble: bool = False) -> Lease:
        """A lease taken without asking Redis (an uncapped channel seen healthy just now)."""
        return Lease(keys[0], keys[1], self._owner + str(next(self._ids)), capped, trouble=trouble)

    # ------------------------------------------------------------------ the calls

    async def acquire(self, keys: tuple[str, str], cap: int | None, pinned: bool) -> Acquired:
        lease = self.lease(keys, cap is not None)
        raw = await self._call(
            self._acquire(
                keys=list(keys),
                args=[cap or 0, self._lease_ms, lease.member, int(pinned), STATE_TTL_MS],
            )
        )
        state = SharedState.parse(raw[4:])
        if raw[0] != 1:
            reason = raw[1].decode() if isinstance(raw[1], bytes) else str(raw[1])
            return Acquired(None, reason, int(raw[3]), state)
        lease.probe = raw[2] == 1
        lease.trouble = state.fails > 0 or state.tripped
        if lease.held:
            self._hold(lease)
        return Acquired(lease, "ok", int(raw[3]), state)

    async def failed(
        self,
        lease: Lease,
        others: Sequence[str],
        busy_seconds: float | None,
        failures_to_cool_down: int,
        cooldown_seconds: float,
    ) -> SharedState:
        """An attempt failed: `busy_seconds` for an upstream 429 (else a failure that counts
        towards the breaker). Gives the slot back. `others`: the breaker hashes of the model's
        other channels."""
        self._held.pop(lease.member, None)
        raw = await self._call(
            self._failed(
                keys=[lease.hash_key, lease.slots_key, *others],
                args=[
                    lease.member,
                    "busy" if busy_seconds is not None else "fail",
                    int((busy_seconds or 0) * 1000),
                    failures_to_cool_down,
                    int(cooldown_seconds * 1000),
                    int(lease.probe),
                    STATE_TTL_MS,
                ],
            )
        )
        return SharedState.parse(raw)

    def answered(self, lease: Lease) -> None:
        """The channel answered after failures or as the probe: the breaker closes (in the
        background: the answer does not wait for it)."""
        lease.trouble = False
        if lease.probe:
            lease.probe = False
            if not lease.capped:
                self._held.pop(lease.member, None)
        self._background(self._answered, [lease.hash_key], [STATE_TTL_MS])

    def release(self, lease: Lease) -> None:
        """The request is done with the channel: its slot (and a probe never reported) go back,
        in the background. Safe to call for a lease Redis holds nothing of."""
        if self._held.pop(lease.member, None) is not None or lease.held:
            self._background(self._release, [lease.hash_key, lease.slots_key], [lease.member])

    async def read(self, keys: Sequence[tuple[str, str]]) -> list[tuple[SharedState, int]]:
        """The breaker state and slots in use of each channel, for the admin API."""
        if not keys:
            return []
        raw = await self._call(self._read(keys=[k for pair in keys for k in pair]))
        return [(SharedState.parse(r), int(r[5])) for r in raw]

    async def close(self) -> None:
        """Stops the renewal and gives back the slots still held (the client is its owner's to close)."""
        for task in [self._renewer, self._reconnect]:
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        if self._tasks:  # the releases and answers under way land first
            await asyncio.wait(list(self._tasks), timeout=self._op_timeout)
        # The slots still held go back now rather than when their leases run out.
        held = list(self._held.values())
        self._held.clear()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self._op_timeout):
                for lease in held:
                    await self._release(keys=[lease.hash_key, lease.slots_key], args=[lease.member])

    # ------------------------------------------------------------------ the machinery

    async def _call(self, call: Awaitable[T]) -> T:
        """One Redis call within the operation timeout; Unavailable (and the fallback) when it fails."""
        try:
            with within(self._op_timeout):
                return await call
        except self._errors as exc:
            self._down(exc)
            raise Unavailable(str(exc)) from exc

    def _down(self, exc: BaseException) -> None:
        if not self.up:
            return
        self.up = False
        log.warning(
            "Redis is unreachable (%s): channel caps and cool-downs are kept per process until it "
            "answers again",
            type(exc).__name__,
        )
        with contextlib.suppress(RuntimeError):  # no running loop: the next call finds out
            self._reconnect = asyncio.get_running_loop().create_task(self._wait_for_redis())

    async def _wait_for_redis(self) -> None:
        while True:
            await asyncio.sleep(self._reconnect_seconds)
            try:
                async with asyncio.timeout(self._op_timeout):
                    await self.redis.ping()
            except self._errors:
                continue
            self.up = True
            log.warning("Redis answers again: channel caps and cool-downs are shared again")
            return

    def _hold(self, lease: Lease) -> None:
        self._held[lease.member] = lease
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.get_running_loop().create_task(self._renew_leases())

    async def _renew_leases(self) -> None:
        """Every RENEW_SECONDS while this process holds leases: each is good for LEASE_SECONDS more."""
        while self._held:
            await asyncio.sleep(self._renew_seconds)
            by_channel: dict[tuple[str, str], list[str]] = {}
            for lease in list(self._held.values()):
                by_channel.setdefault((lease.hash_key, lease.slots_key), []).append(lease.member)
            for (hash_key, slots_key), members in by_channel.items():
                with contextlib.suppress(Unavailable):
                    await self._call(self._renew(keys=[hash_key, slots_key], args=[self._lease_ms, *members]))

    def _background(self, script: Script, keys: list[str], args: list[Any]) -> None:
        """Runs a script without waiting for it; a failure is left behind (a lease runs out by itself)."""

        async def run() -> None:
            with contextlib.suppress(Unavailable):
                await self._call(script(keys=keys, args=args))

        try:
            task = asyncio.get_running_loop().create_task(run())
        except RuntimeError:  # no event loop any more (shutting down): the lease runs out
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

"""Which channel serves a request, and what happens when it fails (spec 7.2, 7.4).

A model has one or more channels. Each attempt goes to a channel chosen by weight among the healthy
channels of the best priority that are below their concurrency cap. An attempt that fails for the
upstream's reasons (429, 5xx, a dropped connection, a timeout) is retried before the client hears of
it: on a channel not yet tried when there is one, else on the same one after an exponential backoff
with full jitter. An upstream 429, a timeout (a whole window again on the same channel is too long a
wait) and a channel refused by its upstream (401, 403, 404: our set-up is wrong there) are not
retried on the same channel, but the request moves on to another one (GatewayError.retry). A request
that must not reach an upstream twice (one that creates a job) is not retried after a failure that
may have come after the upstream received it (GatewayError.retry "never"); it still counts against
the channel.

A channel that fails `failures_to_cool_down` times in a row is cooled down for `cooldown_seconds`
(a circuit breaker), then lets one probe request through: its success brings the channel back, its
failure cools it down again. A model's last usable channel is never cooled down: with nowhere else
to send the request, refusing it outright would only turn upstream errors into 429s. Likewise an
upstream 429 makes its channel busy for its Retry-After while another channel can serve.

Embedded (no Redis), health lives in each worker process's memory: every worker learns it from its
own traffic, and a concurrency cap is split evenly among the workers (at least 1 each). With Redis
(gateway.shared_channels) the caps, the breakers and the busy marks are shared by every process of
every instance, and each process's ChannelHealth mirrors what Redis last answered; while Redis is
unreachable the router runs on that local view as in the embedded case.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import orjson

from .clock import instant_ns
from .config import ChannelConfig, ModelConfig, RoutingSettings
from .errors import GatewayError
from .shared_channels import FRESH_SECONDS, Lease, SharedChannels, SharedState, Unavailable

T = TypeVar("T")
# The request's body as one channel receives it: only the upstream's model name differs.
ChannelBody = Callable[[ChannelConfig], bytes]
# How fast the health figures follow recent attempts (weight of the newest one).
_EWMA: Final = 0.2
# The longest an upstream's Retry-After keeps its channel busy.
_MAX_BUSY_SECONDS: Final = 60.0


def json_body(body: dict[str, Any]) -> ChannelBody:
    """A JSON request body for any channel, encoded once per upstream model name."""
    encoded: dict[str, bytes] = {}

    def for_channel(channel: ChannelConfig) -> bytes:
        name = channel.upstream_model
        if name not in encoded:
            encoded[name] = orjson.dumps(body if body.get("model") == name else {**body, "model": name})
        return encoded[name]

    return for_channel


@dataclass(slots=True)
class Attempt:
    """One try of a request on one channel, as the request log shows it."""

    channel: str
    started_ms: int
    duration_ms: int = 0
    error: str | None = None  # the error code it failed with; None when the channel answered
    status: int | None = None  # the gateway status of that error
    # The try's W3C span (its id goes upstream in traceparent, gateway.telemetry.tracing) and its
    # instants on the monotonic clock (clock.instant_ns; the exported trace's times are made from
    # them, as the request's are); 0 for what was not a try through the router.
    span_id: int = 0
    started_ns: int = 0
    ended_ns: int = 0

    def logged(self) -> dict[str, object]:
        """The try as the request log keeps it: its fields in order, but the span's (those are for
        the exported trace). Written out, not read by reflection: every model request logs its tries."""
        return {
            "channel": self.channel,
            "started_ms": self.started_ms,
            "duration_ms": self.duration_ms,
            "error": self.error,
            "status": self.status,
        }


# The try under way in this task (the router sets it around each call of a request's attempt
# function), so that what sends it upstream can name its span.
CURRENT_ATTEMPT: ContextVar[Attempt | None] = ContextVar("gateway_attempt", default=None)


@dataclass(slots=True)
class ChannelHealth:
    """What this worker knows of one channel."""

    channel: ChannelConfig
    cap: int | None  # this worker's share of the channel's concurrency cap
    in_flight: int = 0
    failures_in_a_row: int = 0
    cool_until: float = 0.0  # monotonic; after it, the breaker is half open
    tripped: bool = False  # cooled down and not yet probed back
    probing: bool = False  # the half-open probe is under way
    busy_until: float = 0.0  # an upstream 429's Retry-After
    probe_until: float = 0.0  # with Redis: another process's probe is under way until then
    seen_at: float = -math.inf  # with Redis: when it last told this channel's state (monotonic)
    keys: tuple[str, str] = ("", "")  # with Redis: the channel's breaker hash and slots zset
    error_rate: float = 0.0  # moving average over recent attempts
    latency_ms: float | None = None  # moving average of answered attempts
    attempts: int = 0
    failures: int = 0

    def state(self, now: float) -> str:
        if self.tripped:
            return "cooling_down" if now < self.cool_until else "half_open"
        if now < self.busy_until:
            return "busy"
        if self.cap is not None and self.in_flight >= self.cap:
            return "at_capacity"
        return "healthy"

    def usable(self, now: float, pinned: bool = False, capped: bool = True) -> bool:
        """Whether a request may go here now. A `pinned` request (its state lives on this channel)
        passes a cooling breaker and a busy mark (routing review: it got the gateway's own 429
        while the upstream would have answered): it has nowhere else to go. `capped`: this
        worker's share of the cap applies (without Redis, or while it is unreachable)."""
        if capped and self.cap is not None and self.in_flight >= self.cap:
            return False
        if now < self.busy_until and not pinned:
            return False
        if self.tripped and not pinned:
            return now >= self.cool_until and now >= self.probe_until and not self.probing
        return True

    def mirror(self, now: float, shared: SharedState) -> None:
        """Take the breaker state Redis answered as this worker's own."""
        self.tripped = shared.tripped
        self.cool_until = now + shared.cool_left
        self.busy_until = now + shared.busy_left
        # Another process's probe may end any moment: ask again soon rather than at its lease's end.
        self.probe_until = now + min(shared.probe_left, FRESH_SECONDS)
        self.failures_in_a_row = shared.fails
        self.seen_at = now

    def free_in(self, now: float) -> float:
        """Seconds until this channel may take a request again, as far as timers tell."""
        return max(self.busy_until - now, self.cool_until - now if self.tripped else 0.0, 0.0)

    def report(self, now: float, shared: tuple[SharedState, int] | None = None) -> dict[str, Any]:
        """Its health for the admin API: with `shared` (Redis's breaker state and slots in use),
        the deployment's view of the breaker, cap and requests in flight; the moving averages and
        counts are always this worker's."""
        if shared is None:
            cap, in_flight, fails, tripped = self.cap, self.in_flight, self.failures_in_a_row, self.tripped
            cool_left, state = max(self.cool_until - now, 0.0), self.state(now)
        else:
            breaker, in_flight = shared
            cap, fails, tripped, cool_left = (
                self.channel.max_concurrency,
                breaker.fails,
                breaker.tripped,
                breaker.cool_left,
            )
            if tripped:
                state = "cooling_down" if cool_left > 0 else "half_open"
            elif breaker.busy_left > 0:
                state = "busy"
            elif cap is not None and in_flight >= cap:
                state = "at_capacity"
            else:
                state = "healthy"
        return {
            "name": self.channel.name,
            "provider": self.channel.provider,
            "base_url": self.channel.base_url,
            "weight": self.channel.weight,
            "priority": self.channel.priority,
            "max_concurrency": cap,
            "state": state,
            "in_flight": in_flight,
            "failures_in_a_row": fails,
            "error_rate": round(self.error_rate, 4),
            "latency_ms": None if self.latency_ms is None else round(self.latency_ms, 1),
            "attempts": self.attempts,
            "failures": self.failures,
            "cooldown_remaining_seconds": round(cool_left, 3) if tripped else 0,
            "shared": shared is not None,
        }


class Slot:
    """A channel taken for one attempt. A stream keeps it until it ends: `release()`, which is
    safe to call more than once."""

    __slots__ = ("_health", "_lease", "_shared", "channel")

    def __init__(
        self, health: ChannelHealth, lease: Lease | None = None, shared: SharedChannels | None = None
    ) -> None:
        self._health: ChannelHealth | None = health
        self._lease = lease
        self._shared = shared
        self.channel = health.channel

    def release(self) -> None:
        if self._health is not None:
            self._health.in_flight -= 1
            self._health = None
            if self._lease is not None and self._shared is not None:
                self._shared.release(self._lease)


class Router:
    def __init__(
        self,
        models: tuple[ModelConfig, ...],
        settings: RoutingSettings,
        workers: int = 1,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        shared: SharedChannels | None = None,
    ) -> None:
        self._settings = settings
        self._clock = clock
        self._sleep = sleep
        self._shared = shared
        self._health = {
            m.name: [
                ChannelHealth(c, None if c.max_concurrency is None else max(1, c.max_concurrency // workers))
                for c in m.channels
            ]
            for m in models
        }
        if shared is not None:
            for name, channels in self._health.items():
                for h in channels:
                    h.keys = shared.keys(name, h.channel.name)

    def health(self) -> dict[str, list[dict[str, Any]]]:
        """Every channel's health as this worker sees it."""
        now = self._clock()
        return {name: [h.report(now) for h in channels] for name, channels in self._health.items()}

    async def report(self) -> dict[str, list[dict[str, Any]]]:
        """Every channel's health for the admin API: with Redis, the breakers, caps and requests in
        flight of the whole deployment; without it (or while it is unreachable), this worker's."""
        shared = self._shared
        if shared is None or not shared.up:
            return self.health()
        every = [h for channels in self._health.values() for h in channels]
        try:
            states = await shared.read([h.keys for h in every])
        except Unavailable:
            return self.health()
        now = self._clock()
        seen = dict(zip((id(h) for h in every), states, strict=True))
        return {
            name: [h.report(now, seen[id(h)]) for h in channels] for name, channels in self._health.items()
        }

    async def close(self) -> None:
        if self._shared is not None:
            await self._shared.close()

    async def run(
        self,
        model: ModelConfig,
        attempt: Callable[[ChannelConfig], Awaitable[T]],
        attempts: list[Attempt],
        only: ChannelConfig | None = None,
    ) -> tuple[T, Slot]:
        """`attempt(channel)` until one succeeds, retrying and failing over as the module says.
        Returns its result and the channel's slot, which the caller releases once the request is
        done with the channel. `only` pins the request to one channel (a Responses turn, whose
        conversation lives there). Each try is appended to `attempts`."""
        every = self._health[model.name]
        pinned = only is not None
        channels = every if only is None else [h for h in every if h.channel is only]
        tried: list[ChannelHealth] = []
        refused: list[ChannelHealth] = []  # not to be tried again by this request
        same_channel_retries = 0
        last: GatewayError | None = None
        shared = self._shared
        for _ in range(1 + self._settings.retries):
            capped = shared is None or not shared.up
            health = self._choose(channels, tried, refused, last, pinned, capped)
            if health in tried:
                # Only the channels already tried are left: back off before trying one again.
                same_channel_retries += 1
                await self._sleep(self._backoff(same_channel_retries))
                if not health.usable(self._clock(), pinned, capped):
                    health = self._choose(channels, tried, refused, last, pinned, capped)
            lease = None
            if shared is not None and not capped:
                health, lease = await self._take(shared, health, channels, tried, refused, last, pinned)
            tried.append(health)
            try:
                return await self._try(health, every, attempt, attempts, lease), Slot(health, lease, shared)
            except GatewayError as err:
                if err.retry is None or err.retry == "never":
                    raise
                if err.retry == "other":
                    refused.append(health)
                last = err
        assert last is not None
        raise last

    async def _take(
        self,
        shared: SharedChannels,
        health: ChannelHealth,
        channels: list[ChannelHealth],
        tried: list[ChannelHealth],
        refused: list[ChannelHealth],
        last: GatewayError | None,
        pinned: bool,
    ) -> tuple[ChannelHealth, Lease | None]:
        """The chosen channel's slot (and probe) from Redis; when Redis refuses it (at its cap
        across the deployment, cooled down or busy by another process's traffic), the next choice
        without it, until one is granted or none is left (provider_overloaded, or the last error).
        Redis unreachable: this attempt goes by the local view (no lease)."""
        passed = list(refused)
        while True:
            now = self._clock()
            capped = health.channel.max_concurrency is not None
            if (
                not capped
                and now - health.seen_at < FRESH_SECONDS
                and not health.tripped
                and not health.failures_in_a_row
                and now >= health.busy_until
            ):
                # Seen healthy just now and no cap to count: no need to ask Redis again.
                return health, shared.lease(health.keys, False)
            try:
                got = await shared.acquire(health.keys, health.channel.max_concurrency, pinned)
            except Unavailable:
                if not health.usable(self._clock(), pinned):
                    health = self._choose(channels, tried, refused, last, pinned)
                return health, None
            health.mirror(self._clock(), got.state)
            if got.lease is not None:
                return health, got.lease
            passed.append(health)
            health = self._choose(channels, tried, passed, last, pinned, capped=False)

    def _choose(
        self,
        channels: list[ChannelHealth],
        tried: list[ChannelHealth],
        refused: list[ChannelHealth],
        last: GatewayError | None,
        pinned: bool,
        capped: bool = True,
    ) -> ChannelHealth:
        now = self._clock()
        usable = [h for h in channels if h.usable(now, pinned, capped) and h not in refused]
        fresh = [h for h in usable if h not in tried]
        pool = fresh or usable
        if not pool:
            if last is not None:
                raise last  # every attempt failed, and no channel is left to try: the last error
            wait = min((h.free_in(now) for h in channels), default=1.0)
            raise GatewayError(
                "provider_overloaded",
                "Every channel of this model is at capacity. Retry with backoff or choose another model.",
                headers={"retry-after": str(max(1, math.ceil(wait)))},
            )
        if len(pool) == 1:  # one channel (most models): nothing to rank
            return pool[0]
        best = min(h.channel.priority for h in pool)
        ranked = [h for h in pool if h.channel.priority == best]
        if len(ranked) == 1:
            return ranked[0]
        return random.choices(ranked, weights=[h.channel.weight for h in ranked])[0]

    async def _try(
        self,
        health: ChannelHealth,
        every: list[ChannelHealth],
        attempt: Callable[[ChannelConfig], Awaitable[T]],
        attempts: list[Attempt],
        lease: Lease | None = None,
    ) -> T:
        now = self._clock()
        probe = health.tripped if lease is None else lease.probe
        if probe:
            health.probing = True
        health.in_flight += 1
        health.attempts += 1
        record = Attempt(
            health.channel.name,
            time.time_ns() // 1_000_000,
            span_id=random.getrandbits(64) or 1,
            started_ns=instant_ns(),
        )
        attempts.append(record)
        current = CURRENT_ATTEMPT.set(record)
        try:
            result = await attempt(health.channel)
        except GatewayError as err:
            self._finish(record, now)
            record.error, record.status = err.code, err.status
            health.in_flight -= 1
            if err.retry is None:  # the upstream answered (the request was at fault): the channel works
                self._answered(health, record.duration_ms, lease)
                if lease is not None and self._shared is not None:
                    self._shared.release(lease)
            elif lease is None or not await self._failed_shared(health, every, err, lease):
                self._failed(health, every, err)
            raise
        except BaseException:
            health.in_flight -= 1
            health.probing = False
            self._finish(record, now)
            record.error = "cancelled"
            if lease is not None and self._shared is not None:
                self._shared.release(lease)
            raise
        finally:
            CURRENT_ATTEMPT.reset(current)
        self._finish(record, now)
        self._answered(health, record.duration_ms, lease)
        return result

    def _finish(self, record: Attempt, started: float) -> None:
        record.duration_ms = int((self._clock() - started) * 1000)
        record.ended_ns = instant_ns()

    def _answered(self, health: ChannelHealth, duration_ms: int, lease: Lease | None = None) -> None:
        health.failures_in_a_row = 0
        health.tripped = health.probing = False
        health.error_rate *= 1 - _EWMA
        health.latency_ms = (
            duration_ms
            if health.latency_ms is None
            else health.latency_ms * (1 - _EWMA) + duration_ms * _EWMA
        )
        if lease is not None and (lease.trouble or lease.probe) and self._shared is not None:
            self._shared.answered(lease)  # the breaker closes for every process

    def _failed(self, health: ChannelHealth, every: list[ChannelHealth], err: GatewayError) -> None:
        now = self._clock()
        health.failures += 1
        health.error_rate = health.error_rate * (1 - _EWMA) + _EWMA
        was_probe, health.probing = health.probing, False
        # Traffic is only ever turned away from a channel that another one can take it from.
        others_usable = any(h is not health and not h.tripped and h.busy_until <= now for h in every)
        if err.code == "provider_overloaded":  # the upstream is at capacity, not broken
            if others_usable:
                health.busy_until = now + _busy_seconds(err)
            return
        health.failures_in_a_row += 1
        if (was_probe or health.failures_in_a_row >= self._settings.failures_to_cool_down) and others_usable:
            health.tripped = True
            health.cool_until = now + self._settings.cooldown_seconds
        else:
            health.tripped = False

    async def _failed_shared(
        self, health: ChannelHealth, every: list[ChannelHealth], err: GatewayError, lease: Lease
    ) -> bool:
        """The failure counted in Redis, by the same rules as _failed, for every process; False
        when Redis is unreachable (the caller counts it locally)."""
        assert self._shared is not None
        try:
            shared = await self._shared.failed(
                lease,
                [h.keys[0] for h in every if h is not health],
                _busy_seconds(err) if err.code == "provider_overloaded" else None,
                self._settings.failures_to_cool_down,
                self._settings.cooldown_seconds,
            )
        except Unavailable:
            return False
        health.failures += 1
        health.error_rate = health.error_rate * (1 - _EWMA) + _EWMA
        health.probing = False
        health.mirror(self._clock(), shared)
        return True

    def _backoff(self, retry: int) -> float:
        """Full jitter over an exponential ceiling (retry 1: up to the base, then doubling)."""
        settings = self._settings
        ceiling = min(settings.retry_backoff_max_seconds, settings.retry_backoff_seconds * 2 ** (retry - 1))
        return random.uniform(0, ceiling)


def _busy_seconds(err: GatewayError) -> float:
    """How long an upstream 429 keeps its channel busy: its Retry-After, at most a minute."""
    after = err.headers.get("retry-after", "1")
    return min(float(after) if after.isdigit() else 1.0, _MAX_BUSY_SECONDS)

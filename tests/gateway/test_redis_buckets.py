"""The Redis bucket store (gateway.redis_buckets) against the Rust core's (gateway.buckets.FileBuckets):
the same answers, exactly, for any sequence of operations, limits and times; its keys expire once
their bucket is full again (and a period has passed); its clock is the Redis server's."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from gateway.buckets import BucketStore, BucketsUnavailable, FileBuckets
from gateway.redis_buckets import RedisBuckets
from gateway.redis_client import connect

MINUTE = 60_000_000_000
T = TypeVar("T")


class Loop:
    """One event loop on a thread of its own, with one Redis client, for the whole module: each
    hypothesis example runs its coroutines there."""

    def __init__(self, url: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.client: Redis = self.run(self._connect(url))

    @staticmethod
    async def _connect(url: str) -> Redis:
        return connect(url)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def close(self) -> None:
        self.run(self.client.aclose())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


@pytest.fixture(scope="module")
def redis_loop(redis_url: str) -> Iterator[Loop]:
    loop = Loop(redis_url)
    prefix = f"test:rb:{uuid.uuid4().hex}:"
    loop.prefix = prefix  # type: ignore[attr-defined]
    try:
        yield loop
    finally:

        async def clean() -> None:
            keys = [k async for k in loop.client.scan_iter(match=prefix + "*")]
            if keys:
                await loop.client.delete(*keys)

        loop.run(clean())
        loop.close()


def prefix_of(loop: Loop) -> str:
    return str(loop.prefix) + uuid.uuid4().hex + ":"  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Op:
    kind: str  # take, available, adjust
    key: int  # which of the example's keys
    limit: int  # which of the example's limits
    amount: int  # n to take, delta to adjust
    dt: int  # time since the previous operation


U64 = 2**64 - 1
periods = st.one_of(
    st.sampled_from([1, 3, 7, 1_000, 999_983, MINUTE]), st.integers(1, 2**40), st.integers(0, 2**62)
)
capacities = st.one_of(st.integers(0, 40), st.integers(0, 10**9), st.integers(0, U64))
refills = st.one_of(st.integers(0, 40), st.integers(1, 10**12), st.integers(1, U64))
limits = st.one_of(
    st.tuples(st.integers(1, 40), st.integers(1, 40), st.sampled_from([7, 1_000, MINUTE])),
    st.tuples(capacities, refills, periods),
)
amounts = st.one_of(st.integers(0, 5), st.integers(0, 45), st.integers(0, 10**12), st.integers(0, U64))
deltas = st.one_of(st.integers(-45, 45), st.integers(-(10**12), 10**12), st.integers(-(2**63), 2**63 - 1))
steps = st.one_of(
    st.just(0), st.integers(0, 50), st.integers(0, 10**10), st.integers(0, 10**14), st.integers(0, 2**60)
)
ops = st.lists(
    st.one_of(
        st.builds(Op, st.just("take"), st.integers(0, 1), st.integers(0, 2), amounts, steps),
        st.builds(Op, st.just("available"), st.integers(0, 1), st.integers(0, 2), st.just(0), steps),
        st.builds(Op, st.just("adjust"), st.integers(0, 1), st.integers(0, 2), deltas, steps),
    ),
    min_size=1,
    max_size=40,
)


async def run_ops(
    store: BucketStore, start: int, chosen: list[tuple[int, int, int]], sequence: list[Op]
) -> list[object]:
    """Each operation's answer (an exception's type when it raised), in order."""
    answers: list[object] = []
    now = start
    for op in sequence:
        now = min(now + op.dt, U64)
        capacity, refill, period = chosen[op.limit]
        key = f"k{op.key}"
        try:
            if op.kind == "take":
                taken = await store.try_take(key, capacity, refill, period, op.amount, now)
                answers.append((taken.allowed, taken.remaining, taken.retry_after_ns))
            elif op.kind == "available":
                answers.append(await store.available(key, capacity, refill, period, now))
            else:
                answers.append(await store.adjust(key, capacity, refill, period, op.amount, now))
        except (ValueError, OverflowError) as exc:
            answers.append(type(exc).__name__)
    return answers


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    chosen=st.lists(limits, min_size=3, max_size=3),
    start=st.one_of(st.just(1_800_000_000 * 10**9), st.integers(0, 2**63)),
    sequence=ops,
)
def test_the_script_answers_as_the_rust_core(
    redis_loop: Loop,
    tmp_path_factory: pytest.TempPathFactory,
    chosen: list[tuple[int, int, int]],
    start: int,
    sequence: list[Op],
) -> None:
    """Random limits (tiny to the largest the core accepts, and invalid ones: both refuse them
    alike), random takes, corrections into debt and back, random time steps: every answer equal."""
    expected = asyncio.run(
        run_ops(FileBuckets(tmp_path_factory.mktemp("rb") / "b", 64), start, chosen, sequence)
    )
    # A long expiry slack: the example's times are its own, not the clock Redis expires keys by.
    redis = RedisBuckets(redis_loop.client, prefix_of(redis_loop), expiry_slack_ms=600_000)
    assert redis_loop.run(run_ops(redis, start, chosen, sequence)) == expected


def test_limits_the_core_refuses_are_refused(redis_loop: Loop) -> None:
    redis = RedisBuckets(redis_loop.client, prefix_of(redis_loop))
    for capacity, refill, period in ((1, 0, MINUTE), (1, 1, 0), (2**64 - 1, 1, 2**62)):
        with pytest.raises(ValueError):
            redis_loop.run(redis.available("k", capacity, refill, period, 0))
    with pytest.raises(OverflowError):
        redis_loop.run(redis.try_take("k", 1, 1, MINUTE, -1, 0))
    with pytest.raises(OverflowError):
        redis_loop.run(redis.adjust("k", 1, 1, MINUTE, 2**63, 0))


def test_time_going_backwards_counts_as_no_time(redis_loop: Loop, tmp_path: Path) -> None:
    sequence = [(10, 0), (3, 5 * MINUTE // 10), (1, -(3 * MINUTE // 10)), (1, 2 * MINUTE // 10)]

    async def go(store: BucketStore) -> list[tuple[bool, int, int]]:
        now, out = 10**18, []
        for n, dt in sequence:
            now += dt
            taken = await store.try_take("k", 10, 10, MINUTE, n, now)
            out.append((taken.allowed, taken.remaining, taken.retry_after_ns))
        return out

    redis = RedisBuckets(redis_loop.client, prefix_of(redis_loop))
    assert redis_loop.run(go(redis)) == asyncio.run(go(FileBuckets(tmp_path / "b", 64)))


def test_keys_expire_when_full_again_on_the_servers_clock(redis_loop: Loop) -> None:
    prefix = prefix_of(redis_loop)
    redis = RedisBuckets(redis_loop.client, prefix, expiry_slack_ms=1_000)
    client = redis_loop.client

    async def go() -> None:
        # Every operation writes its bucket, kept at least one period and the slack...
        assert await redis.available("idle", 10, 10, MINUTE, None) == 10
        assert 60_000 < await client.pttl(prefix + "idle") <= 61_000
        # ... or until it is full again: 3 taken at 1 a minute, full in 3 minutes.
        taken = await redis.try_take("slow", 10, 1, MINUTE, 3, None)
        assert taken.allowed and taken.remaining == 7
        assert 180_000 < await client.pttl(prefix + "slow") <= 181_000
        # In debt for ages: kept a week at most (then it starts full).
        await redis.adjust("debt", 10, 1, MINUTE, -(10**9), None)
        assert 7 * 24 * 3600 * 1000 - 5_000 < await client.pttl(prefix + "debt") <= 7 * 24 * 3600 * 1000
        # The server's clock: one a minute, taken, then refused for about a minute.
        assert (await redis.try_take("clock", 1, 1, MINUTE, 1, None)).allowed
        refused = await redis.try_take("clock", 1, 1, MINUTE, 1, None)
        assert not refused.allowed and MINUTE - 5 * 10**9 < refused.retry_after_ns <= MINUTE

    redis_loop.run(go())


def test_an_unreachable_redis_raises_buckets_unavailable() -> None:
    async def go() -> None:
        client = connect("redis://127.0.0.1:1/0")
        try:
            with pytest.raises(BucketsUnavailable) as caught:
                await RedisBuckets(client).try_take("k", 1, 1, MINUTE, 1, None)
            assert isinstance(caught.value, OSError)
        finally:
            await client.aclose()

    asyncio.run(go())

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

from gateway.buckets import BucketStore, BucketsUnavailable, FileBuckets
from gateway.redis_buckets import RedisBuckets
from gateway.redis_client import RedisClient, connect
from harness import forget_redis_keys

MINUTE = 60_000_000_000
T = TypeVar("T")


class Loop:
    """One event loop on a thread of its own, with one Redis client, for the whole module: each
    hypothesis example runs its coroutines there."""

    def __init__(self, url: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.url = url
        self.client: RedisClient = connect(url)

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
        forget_redis_keys(prefix + "*", redis_url)
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
# Backwards too: a moment (processes reading the clock in another order) and a step of the clock
# (an NTP correction), around the core's CLOCK_STEP_NS and beyond.
steps = st.one_of(
    st.just(0), st.integers(0, 50), st.integers(0, 10**10), st.integers(0, 10**14), st.integers(0, 2**60),
    st.integers(-2 * 10**9, 0), st.integers(-(10**14), 0),
)  # fmt: skip


def op_lists(apart: st.SearchStrategy[int]) -> st.SearchStrategy[list[Op]]:
    """Sequences of up to 40 operations on two keys and three limits, `apart` nanoseconds apart."""
    return st.lists(
        st.one_of(
            st.builds(Op, st.just("take"), st.integers(0, 1), st.integers(0, 2), amounts, apart),
            st.builds(Op, st.just("available"), st.integers(0, 1), st.integers(0, 2), st.just(0), apart),
            st.builds(Op, st.just("adjust"), st.integers(0, 1), st.integers(0, 2), deltas, apart),
        ),
        min_size=1,
        max_size=40,
    )


ops = op_lists(steps)


async def run_ops(
    store: BucketStore, start: int, chosen: list[tuple[int, int, int]], sequence: list[Op]
) -> list[object]:
    """Each operation's answer (an exception's type when it raised), in order."""
    answers: list[object] = []
    now = start
    for op in sequence:
        now = max(0, min(now + op.dt, U64))
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


def assert_answers_as_the_core(
    redis_loop: Loop,
    work: Path,
    start: int,
    chosen: list[tuple[int, int, int]],
    sequence: list[Op],
    quick_modes: tuple[bool, ...] = (True, False),
) -> None:
    """The script gives the Rust core's answers to `sequence`, with its quick path allowed and not."""
    expected = asyncio.run(run_ops(FileBuckets(work / "b", 64), start, chosen, sequence))
    for quick in quick_modes:
        prefix = f"{prefix_of(redis_loop)}{uuid.uuid4().hex[:8]}:"
        # A long expiry slack: the example's times are its own, not the clock Redis expires keys by.
        redis = RedisBuckets(redis_loop.client, prefix, expiry_slack_ms=600_000, quick=quick)
        assert redis_loop.run(run_ops(redis, start, chosen, sequence)) == expected


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
    assert_answers_as_the_core(redis_loop, tmp_path_factory.mktemp("rb"), start, chosen, sequence, (True,))


MS = 1_000_000
# Whole milliseconds, and limits whose level in token x ms stays below 2^51 or just above it: the
# script's quick path, and its way back to the bignum one at the edges.
ms_limits = st.tuples(
    st.one_of(st.integers(0, 40), st.integers(0, 10**9), st.just(2**51 // 60_000), st.integers(0, 10**12)),
    st.one_of(st.integers(1, 40), st.integers(1, 10**9), st.integers(8 * 10**9, 10**10)),
    st.one_of(st.sampled_from([1, 7, 1_000, 60_000]), st.integers(1, 10**7)).map(lambda ms: ms * MS),
)
ms_steps = st.one_of(
    st.just(0), st.integers(0, 50), st.integers(0, 10**5), st.integers(0, 10**9),
    st.integers(-2_000, 0), st.integers(-(10**8), 0),
).map(lambda ms: ms * MS)  # fmt: skip
ms_ops = op_lists(ms_steps)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    chosen=st.lists(ms_limits, min_size=3, max_size=3),
    start=st.one_of(st.just(1_800_000_000_000 * MS), st.integers(0, 2**44).map(lambda ms: ms * MS)),
    sequence=ms_ops,
)
def test_the_quick_path_answers_as_the_rust_core(
    redis_loop: Loop,
    tmp_path_factory: pytest.TempPathFactory,
    chosen: list[tuple[int, int, int]],
    start: int,
    sequence: list[Op],
) -> None:
    """Times and periods in whole milliseconds, as the gateway's own buckets on the server's clock
    are: the script's quick path (doubles) answers as the Rust core and as its own bignum path."""
    assert_answers_as_the_core(redis_loop, tmp_path_factory.mktemp("rb"), start, chosen, sequence)


@pytest.mark.parametrize(
    ("limit", "sequence"),
    [
        # 10^6 = 7 x 142857 + 1: a remainder of exactly 1 still rounds the wait up.
        ((1, 7, MS), [Op("take", 0, 0, 1, 0), Op("take", 0, 0, 1, 0), Op("take", 0, 0, 1, MS)]),
        # A wait beyond u64::MAX nanoseconds is u64::MAX, and so is its key's expiry bound.
        ((10**9, 1, 60_000 * MS), [Op("take", 0, 0, 10**9, 0), Op("take", 0, 0, 10**9, 0)]),
        # ... and one just below it is not: 18446744073709 ms, then 18446744073710 ms.
        ((18446744073709, 1, MS), [Op("take", 0, 0, 18446744073709, 0), Op("take", 0, 0, 18446744073709, 0)]),
        ((18446744073710, 1, MS), [Op("take", 0, 0, 18446744073710, 0), Op("take", 0, 0, 18446744073710, 0)]),
        # The largest level the quick path keeps, into debt and back.
        (
            (2**51 // 60_000, 9 * 10**9, 60_000 * MS),
            [
                Op("take", 0, 0, 2**51 // 60_000, 0),
                Op("adjust", 0, 0, -(2**51 // 60_000), 0),
                Op("available", 0, 0, 0, MS),
                Op("adjust", 0, 0, 5, 0),
                Op("take", 0, 0, 3, 7 * MS),
            ],
        ),
        # Just past the quick path's bounds: the bignum path answers.
        ((10, 9 * 10**9 + 1, MS), [Op("take", 0, 0, 10, 0), Op("take", 0, 0, 3, MS)]),
        ((2**51 // 60_000 + 1, 1, 60_000 * MS), [Op("take", 0, 0, 5, 0), Op("available", 0, 0, 0, MS)]),
    ],
)
def test_the_quick_paths_edges(
    redis_loop: Loop, tmp_path: Path, limit: tuple[int, int, int], sequence: list[Op]
) -> None:
    assert_answers_as_the_core(redis_loop, tmp_path, 1_800_000_000_000 * MS, [limit], sequence)


def test_the_servers_clock_is_read_to_the_millisecond(redis_loop: Loop) -> None:
    """So that the gateway's buckets (on the server's clock) take the quick path."""
    prefix = prefix_of(redis_loop)
    redis = RedisBuckets(redis_loop.client, prefix)

    async def go() -> None:
        await redis.try_take("clock-ms", 10, 10, MINUTE, 3, None)
        stored = await redis_loop.client.execute("GET", prefix + "clock-ms")
        level, last, period, capacity = stored.split()
        assert last.endswith(b"000000") and level.endswith(b"000000") and int(period) == MINUTE
        assert int(capacity) == 10

    redis_loop.run(go())


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
        assert 60_000 < await client.execute("PTTL", prefix + "idle") <= 61_000
        # ... or until it is full again: 3 taken at 1 a minute, full in 3 minutes.
        taken = await redis.try_take("slow", 10, 1, MINUTE, 3, None)
        assert taken.allowed and taken.remaining == 7
        assert 180_000 < await client.execute("PTTL", prefix + "slow") <= 181_000
        # In debt for ages: kept a week at most (then it starts full).
        await redis.adjust("debt", 10, 1, MINUTE, -(10**9), None)
        assert (
            7 * 24 * 3600 * 1000 - 5_000
            < await client.execute("PTTL", prefix + "debt")
            <= 7 * 24 * 3600 * 1000
        )
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


@pytest.mark.parametrize("quick", [True, False])
def test_a_changed_limit_keeps_what_was_taken(redis_loop: Loop, quick: bool) -> None:
    """Review: a limit raised from 6 to 100 requests a minute refused the next requests until the
    bucket refilled; then (code review) a raise that topped the bucket up each time let limits
    asked for in turn (processes learning of a change at different moments) through many times
    over. What was taken stays taken, up or down."""
    prefix = prefix_of(redis_loop)
    redis = RedisBuckets(redis_loop.client, prefix, quick=quick)

    async def go() -> None:
        assert (await redis.try_take("k", 6, 6, MINUTE, 6, 0)).allowed
        assert not (await redis.try_take("k", 6, 6, MINUTE, 1, 0)).allowed
        taken = await redis.try_take("k", 100, 100, MINUTE, 1, 0)
        assert taken.allowed and taken.remaining == 93
        allowed = 0
        for _ in range(3):
            for limit in (100, 6):
                while (await redis.try_take("k", limit, limit, MINUTE, 1, 0)).allowed:
                    allowed += 1
        assert allowed == 93
        assert await redis.available("k", 3, 3, MINUTE, 0) == 0

    redis_loop.run(go())

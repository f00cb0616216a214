"""The token bucket through Python, with an injected clock."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.core import CoreError, TokenBucket

MINUTE = 60_000_000_000


def test_per_minute_limit_and_retry_after() -> None:
    bucket = TokenBucket(3, 3, MINUTE, 0)
    assert [bucket.try_take(1, 0).remaining for _ in range(3)] == [2, 1, 0]
    refused = bucket.try_take(1, 0)
    assert not refused.allowed and refused.retry_after_ns == 20_000_000_000
    assert bucket.try_take(1, 20_000_000_000).allowed


def test_adjust_state_and_errors() -> None:
    bucket = TokenBucket(10, 10, MINUTE, 0)
    bucket.try_take(10, 0)
    bucket.adjust(4, 0)
    assert bucket.available(0) == 4
    bucket.adjust(-10, 0)
    assert bucket.available(0) == 0
    level, last = bucket.state
    assert level < 0 and last == 0
    copy = TokenBucket.from_state(10, 10, MINUTE, level, last)
    assert copy.try_take(1, MINUTE).remaining == bucket.try_take(1, MINUTE).remaining
    assert bucket.capacity == 10
    with pytest.raises(CoreError):
        TokenBucket(1, 0, MINUTE, 0)
    with pytest.raises(OverflowError):
        TokenBucket(-1, 1, 1, 0)


@given(
    capacity=st.integers(1, 1000),
    refill=st.integers(1, 1000),
    period=st.integers(1, 10**10),
    steps=st.lists(
        st.tuples(st.integers(0, 1500), st.integers(0, 5 * 10**9), st.integers(0, 30)), max_size=100
    ),
)
def test_admitted_never_exceeds_capacity_plus_refill(
    capacity: int, refill: int, period: int, steps: list[tuple[int, int, int]]
) -> None:
    bucket = TokenBucket(capacity, refill, period, 0)
    now = admitted = 0
    for n, dt, debt in steps:
        now += dt
        bucket.adjust(-debt, now)
        result = bucket.try_take(n, now)
        if result.allowed:
            admitted += n
        elif n <= capacity:
            assert result.retry_after_ns > 0
            assert (
                TokenBucket.from_state(capacity, refill, period, *bucket.state)
                .try_take(n, now + result.retry_after_ns)
                .allowed
            )
        # Exact integers: admitted * period <= capacity * period + refill * elapsed.
        assert admitted * period <= capacity * period + refill * now


@given(
    capacity=st.integers(1, 500),
    refill=st.integers(1, 500),
    period=st.integers(1, 10**10),
    steps=st.lists(
        st.tuples(st.integers(0, 600), st.integers(-(10**9), 5 * 10**9), st.integers(-40, 40)), max_size=80
    ),
)
def test_net_admitted_bound_with_refunds_and_clock_jitter(
    capacity: int, refill: int, period: int, steps: list[tuple[int, int, int]]
) -> None:
    """Refunds (positive adjust) may be taken again, so they count against the bound; a clock that
    steps back is no time passing."""
    bucket = TokenBucket(capacity, refill, period, 0)
    clock = latest = net = 0
    for n, dt, delta in steps:
        clock = max(clock + dt, 0)
        latest = max(latest, clock)
        bucket.adjust(delta, clock)
        net -= max(delta, 0)
        result = bucket.try_take(n, clock)
        if result.allowed:
            net += n
            assert result.retry_after_ns == 0
        assert result.remaining == bucket.available(clock) <= capacity
        assert net * period <= capacity * period + refill * latest
        level, _ = bucket.state
        assert level <= capacity * period


def test_more_than_capacity_waits_until_full() -> None:
    bucket = TokenBucket(10, 10, MINUTE, 0)
    refused = bucket.try_take(11, 0)
    assert not refused.allowed and refused.retry_after_ns == 0 and refused.remaining == 10
    bucket.try_take(4, 0)
    assert bucket.try_take(11, 0).retry_after_ns == 24_000_000_000


def test_time_backwards_is_no_time_and_state_bounds() -> None:
    bucket = TokenBucket(5, 1, 1_000, 10_000)
    assert bucket.try_take(5, 10_000).allowed
    assert not bucket.try_take(1, 0).allowed
    assert bucket.state == (0, 10_000)
    assert bucket.try_take(1, 11_000).allowed
    with pytest.raises(CoreError):
        TokenBucket.from_state(5, 1, 1_000, 5_001, 0)  # above capacity * period
    with pytest.raises(CoreError):
        TokenBucket.from_state(5, 1, 1_000, -(2**126), 0)  # deeper debt than the bucket can hold
    with pytest.raises(CoreError):
        TokenBucket(2**64 - 1, 1, 2**64 - 1, 0)  # capacity * period beyond exact arithmetic


def test_extreme_debt_saturates_instead_of_wrapping() -> None:
    bucket = TokenBucket(1, 1, 2**64 - 1, 0)
    bucket.adjust(-(2**63), 0)
    result = bucket.try_take(1, 0)
    assert not result.allowed and result.retry_after_ns == 2**64 - 1 and result.remaining == 0

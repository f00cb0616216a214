"""A key's own credit limit (spec 5.4): counted per UTC calendar period, refused with
key_budget_exceeded once used up, even while the account has credits."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway import clock
from gateway.auth import display_prefix, generate_key, hash_key
from gateway.budget import FOREVER, counted, period_start_ms, spent_at
from gateway.errors import GatewayError
from gateway.funds import ZERO, Funds, Hold
from gateway.store import KeyContext, Store, UsageRecord, open_store
from harness import Gateway, StoreSpec, store_spec

MS = st.integers(min_value=0, max_value=4_102_444_800_000)  # 1970 to 2100


def utc(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000)


@given(MS)
def test_periods_start_at_utc_calendar_boundaries(at: int) -> None:
    moment = datetime.fromtimestamp(at / 1000, tz=UTC)
    day, week, month = (period_start_ms(r, at) for r in ("daily", "weekly", "monthly"))
    for start in (day, week, month):
        begin = datetime.fromtimestamp(start / 1000, tz=UTC)
        assert start <= at and (begin.hour, begin.minute, begin.second, begin.microsecond) == (0, 0, 0, 0)
    assert datetime.fromtimestamp(day / 1000, tz=UTC).date() == moment.date()
    assert datetime.fromtimestamp(week / 1000, tz=UTC).weekday() == 0 and at - week < 7 * 86_400_000
    first = datetime.fromtimestamp(month / 1000, tz=UTC)
    assert first.day == 1 and (first.year, first.month) == (moment.year, moment.month)
    assert period_start_ms(None, at) == FOREVER


def test_boundaries_exactly() -> None:
    # Sunday 2026-11-29 23:59:59.999 and the Monday that follows.
    sunday, monday = utc("2026-11-29T23:59:59.999"), utc("2026-11-30T00:00:00")
    assert period_start_ms("daily", sunday) == utc("2026-11-29T00:00:00")
    assert period_start_ms("daily", monday) == monday
    assert period_start_ms("weekly", sunday) == utc("2026-11-23T00:00:00")
    assert period_start_ms("weekly", monday) == monday
    assert period_start_ms("monthly", utc("2026-11-30T23:59:59")) == utc("2026-11-01T00:00:00")
    assert period_start_ms("monthly", utc("2026-12-01T00:00:00")) == utc("2026-12-01T00:00:00")


@pytest.mark.parametrize(
    ("reset", "inside", "after_reset"),
    [
        ("daily", "2026-11-23T23:00:00", "2026-11-24T00:00:00"),
        ("weekly", "2026-11-29T23:00:00", "2026-11-30T00:00:00"),
        ("monthly", "2026-11-30T23:00:00", "2026-12-01T00:00:00"),
        (None, "2027-06-01T00:00:00", None),
    ],
)
def test_limit_used_up_then_reset(
    tmp_path: Path, backend: str, reset: str | None, inside: str, after_reset: str | None
) -> None:
    """Holds against a key limit of 0.05 with an injected clock: 0.02 and 0.03 fit and are spent;
    then nothing fits until the period resets, while the account is far from empty."""
    spent_at = utc("2026-11-23T10:00:00")

    async def go(spec: StoreSpec) -> list[str]:
        store = open_store(spec.settings())
        await store.start()
        funds = Funds(store)
        try:
            ctx = (await _key_with_limit(store, "0.05", reset))[1]
            outcomes = []
            for i, cost in enumerate(("0.02", "0.03")):
                outcome, held = await _hold(funds, ctx, Decimal(cost), spent_at)
                outcomes.append(outcome)
                assert held is not None
                await store.settle(_record(f"r{i}", ctx, Decimal(cost), spent_at))
                funds.release(held, Decimal(cost))
                # An awaited write queued behind the settlement: the one writer applies them in order.
                await store.purge_responses(0)
            key = await store.get_key(ctx.key.id)
            assert key is not None and key.spent == Decimal("0.05")
            assert await store.get_account(ctx.account.id) == replace(ctx.account, balance=Decimal("99.95"))
            for moment in (inside, after_reset) if after_reset else (inside,):
                outcome, held = await _hold(funds, ctx, Decimal("0.01"), utc(moment))
                outcomes.append(outcome)
                if held is not None:
                    funds.release(held, Decimal(0))
            return outcomes
        finally:
            await store.close()

    expected = ["ok", "ok", "key_budget_exceeded"] + (["ok"] if after_reset else [])
    with store_spec(tmp_path, backend) as spec:
        assert asyncio.run(go(spec)) == expected


def test_a_new_limit_reset_starts_a_fresh_count(tmp_path: Path, backend: str) -> None:
    """Changing a key's limit_reset starts its count again in the new reset's period (docs/admin.md):
    a limit used up daily, made monthly, has its whole limit again, and the charges after the change
    count in the new period (the old count's period is later than the new reset's own start, and
    would otherwise count nothing from then on). Setting the same reset again changes nothing."""

    async def go(spec: StoreSpec) -> list[str]:
        store = open_store(spec.settings())
        await store.start()
        funds = Funds(store)
        try:
            secret, ctx = await _key_with_limit(store, "0.05", "daily")
            key = ctx.key
            outcomes = []
            now = clock.now_ms()
            outcome, held = await _hold(funds, ctx, Decimal("0.05"), now)
            assert held is not None
            await _charge(store, funds, held, _record("r0", ctx, Decimal("0.05"), now))
            outcomes.append((await _hold(funds, ctx, Decimal("0.01"), now))[0])

            changed = await store.update_key(key.id, {"limit_reset": "monthly"})
            assert changed is not None
            assert (changed.spent, changed.spent_period_ms) == (ZERO, period_start_ms("monthly", now))
            await funds.answer_recalls()  # the housekeeping pass of this process
            found = await store.find_key(hash_key(secret))  # the key as its next request finds it
            assert found is not None
            ctx = found
            for i in (1, 2):
                outcome, held = await _hold(funds, ctx, Decimal("0.02"), now)
                outcomes.append(outcome)
                assert held is not None
                await _charge(store, funds, held, _record(f"r{i}", ctx, Decimal("0.02"), now))
            outcomes.append((await _hold(funds, ctx, Decimal("0.02"), now))[0])
            assert await store.update_key(key.id, {"limit_reset": "monthly"}) is not None
            again = await store.get_key(key.id)
            assert again is not None and again.spent == Decimal("0.04")
            for reset in (None, "weekly"):  # never and back: each a fresh count
                cleared = await store.update_key(key.id, {"limit_reset": reset})
                assert cleared is not None
                assert (cleared.spent, cleared.spent_period_ms) == (ZERO, period_start_ms(reset, now))
            return outcomes
        finally:
            await store.close()

    with store_spec(tmp_path, backend) as spec:
        assert asyncio.run(go(spec)) == ["key_budget_exceeded", "ok", "ok", "key_budget_exceeded"]


def test_a_clock_behind_the_keys_period_never_lifts_its_limit(tmp_path: Path, backend: str) -> None:
    """A process whose clock is a moment behind the key's period (another instance's clock ahead
    moved it over midnight, or this one's stepped back): the key is still in its later period, not
    spending 0 (time review: the whole limit could be spent again), and a charge that ended "before"
    that period counts in it rather than in no period at all."""
    day_two = utc("2026-11-24T00:00:00.100")
    behind = day_two - 200  # 23:59:59.900 of the day before

    async def go(spec: StoreSpec) -> tuple[list[str], Decimal, int]:
        store = open_store(spec.settings())
        await store.start()
        funds = Funds(store)
        try:
            ctx = (await _key_with_limit(store, "0.05", "daily"))[1]
            outcomes = []
            outcome, held = await _hold(funds, ctx, Decimal("0.04"), day_two)
            outcomes.append(outcome)
            assert held is not None
            await _charge(store, funds, held, _record("r0", ctx, Decimal("0.04"), day_two))
            outcomes.append((await _hold(funds, ctx, Decimal("0.02"), behind))[0])
            outcome, held = await _hold(funds, ctx, Decimal("0.01"), behind)
            outcomes.append(outcome)
            assert held is not None
            await _charge(store, funds, held, _record("r1", ctx, Decimal("0.01"), behind))
            outcomes.append((await _hold(funds, ctx, Decimal("0.01"), day_two))[0])
            key = await store.get_key(ctx.key.id)
            assert key is not None
            return outcomes, key.spent, key.spent_period_ms
        finally:
            await store.close()

    with store_spec(tmp_path, backend) as spec:
        outcomes, spent, period = asyncio.run(go(spec))
    assert outcomes == ["ok", "key_budget_exceeded", "ok", "key_budget_exceeded"]
    assert (spent, period) == (Decimal("0.05"), period_start_ms("daily", day_two))


@given(
    st.sampled_from(["daily", "weekly", "monthly", None]),
    st.lists(st.tuples(MS, st.integers(min_value=0, max_value=10**6)), min_size=1, max_size=8),
)
def test_a_keys_period_never_goes_back_and_every_charge_counts_in_it(
    reset: str | None, charges: list[tuple[int, int]]
) -> None:
    """budget.counted, one charge after another: the key's period is the latest of its charges'
    ends, and its count every charge since that period began (a charge of an earlier period, late,
    counts in it); spent_at reads that count at any moment not after the period's end."""
    spent, period = Decimal(0), FOREVER
    in_period = Decimal(0)
    for ended, micro in charges:
        cost = Decimal(micro) / 1_000_000
        before = period
        spent, period = counted(reset, spent, period, cost, ended)
        assert period == max(before, period_start_ms(reset, ended))
        in_period = cost if period != before else in_period + cost
        assert spent == in_period
        assert spent_at(reset, spent, period, ended) == spent  # a moment behind the period: its count
        assert spent_at(reset, spent, period, period) == spent


def test_a_lowered_limit_takes_back_what_was_leased(tmp_path: Path, backend: str) -> None:
    """A process leases a key's limit as it finds it (one owner: all of it); lowered, the lease is
    recalled with the change, and the process's next pass gives back what nothing holds: the next
    request is measured against the new limit, not spent out of the old lease. A request running
    under the old limit keeps its hold."""

    async def go(spec: StoreSpec) -> list[str]:
        store = open_store(spec.settings())
        await store.start()
        funds = Funds(store)
        try:
            secret, ctx = await _key_with_limit(store, "1", None)
            key = ctx.key
            now = clock.now_ms()
            outcomes = []
            running = (await _hold(funds, ctx, Decimal("0.003"), now))[1]
            assert running is not None
            assert await store.update_key(key.id, {"credit_limit": Decimal("0.004")}) is not None
            assert await funds.answer_recalls() == 1
            found = await store.find_key(hash_key(secret))  # the key as its next request finds it
            assert found is not None
            ctx = found
            # 0.001 is left beside the running request's 0.003: 0.002 does not fit, 0.001 does.
            for amount in ("0.002", "0.001"):
                outcome, held = await _hold(funds, ctx, Decimal(amount), now)
                outcomes.append(outcome)
                if held is not None:
                    funds.release(held, ZERO)
            await _charge(store, funds, running, _record("r0", ctx, Decimal("0.003"), now))
            return outcomes
        finally:
            await store.close()

    with store_spec(tmp_path, backend) as spec:
        assert asyncio.run(go(spec)) == ["key_budget_exceeded", "ok"]


def test_a_refusal_never_says_enough_is_available(tmp_path: Path, backend: str) -> None:
    """A hold refused while another request lets its hold go (during the refusal's own look at the
    money) looks again and holds, rather than answer "may cost $0.5; $1 available"."""

    async def go(spec: StoreSpec) -> tuple[str, str]:
        store = open_store(spec.settings())
        await store.start()
        funds = Funds(store)
        try:
            ctx = (await _key_with_limit(store, "1", None))[1]
            now = clock.now_ms()
            running = (await _hold(funds, ctx, Decimal("0.7"), now))[1]
            assert running is not None
            free = store.free

            async def free_as_the_running_request_ends(kind: str, pot_id: str, now_ms: int) -> Decimal | None:
                if running.open:
                    funds.release(running, ZERO)
                return await free(kind, pot_id, now_ms)

            store.free = free_as_the_running_request_ends  # type: ignore[method-assign]
            outcome, held = await _hold(funds, ctx, Decimal("0.5"), now)
            store.free = free  # type: ignore[method-assign]
            if held is not None:
                funds.release(held, ZERO)
            after, again = await _hold(funds, ctx, Decimal("0.5"), now)
            if again is not None:
                funds.release(again, ZERO)
            return outcome, after
        finally:
            await store.close()

    with store_spec(tmp_path, backend) as spec:
        assert asyncio.run(go(spec)) == ("ok", "ok")


async def _key_with_limit(store: Store, credit_limit: str, reset: str | None) -> tuple[str, KeyContext]:
    """A key with this credit limit and reset, on an account of its own holding 100: its secret and
    its context."""
    account = await store.create_account("a", Decimal(100))
    secret = generate_key()
    await store.create_key(
        account.id,
        "k",
        hash_key(secret),
        display_prefix(secret),
        None,
        credit_limit=Decimal(credit_limit),
        limit_reset=reset,
    )
    ctx = await store.find_key(hash_key(secret))
    assert ctx is not None
    return secret, ctx


async def _charge(store: Store, funds: Funds, held: Hold, record: UsageRecord) -> None:
    """Settle `record` for the hold, as billing does, and wait until the store has applied it."""
    await store.settle(record)
    funds.release(held, record.cost)
    await store.purge_responses(0)  # SQLite: an awaited write behind the settlement, applied in order
    await store.get_key(record.key_id)  # PostgreSQL: a read waits for this process's settlements


async def _hold(funds: Funds, ctx: KeyContext, amount: Decimal, now_ms: int) -> tuple[str, Hold | None]:
    try:
        return "ok", await funds.hold(ctx, amount, now_ms)
    except GatewayError as err:
        return err.code, None


def _record(rid: str, ctx: KeyContext, cost: Decimal, at_ms: int) -> UsageRecord:
    return UsageRecord(rid, "req", ctx.key.id, ctx.account.id, "m", "completed", 1, 1, cost, at_ms, at_ms)


@pytest.fixture
def gw(backend_gw: Gateway) -> Gateway:
    """The gateway tests run on both store backends (tests/conftest.py)."""
    return backend_gw


def test_through_the_gateway(gw: Gateway) -> None:
    """A key whose limit cannot cover a request's estimate is refused before the request runs, with
    the account's balance untouched."""
    handle = gw.new_key(credit_limit="0.0000001", limit_reset="daily")
    with openai.OpenAI(base_url=gw.openai_base, api_key=handle.key, max_retries=0) as client:
        body = {"model": "openai/gpt-4o-mini", "messages": [{"role": "user", "content": "spend"}]}
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(**body)  # type: ignore[call-overload]
    assert caught.value.code == "key_budget_exceeded"
    assert isinstance(caught.value.body, dict) and caught.value.body["type"] == "insufficient_credits"
    time.sleep(0.1)  # a charge, if there were one, would have landed by now
    assert gw.balance(handle.account_id) == 100

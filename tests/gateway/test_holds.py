"""Holds (gateway.funds): no concurrency can overspend a balance or a key's credit limit.

Each request asks for max_tokens = OUTPUT and the simulator writes exactly that many one-token
words, so a request's estimate (its prompt plus OUTPUT tokens of output) is exactly its cost: a
balance of K times that cost allows exactly K requests, however they interleave.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from contextlib import suppress
from decimal import Decimal
from pathlib import Path

import httpx
import pytest

from harness import Gateway, NeverHappened, chat_model, eventually, gateway

MODEL = "openai/gpt-4o-mini"
OUTPUT = 8
BODY = {
    "model": MODEL,
    "max_tokens": OUTPUT,
    "messages": [{"role": "user", "content": "hold this [sim tokens=40 ttft=50ms]"}],
}
CONCURRENT = 200
K = 37


def one_cost(gw: Gateway) -> Decimal:
    """What one request of BODY costs, from a separate account."""
    probe = gw.new_key()
    with gw.client(probe.key) as c:
        r = c.post("/v1/chat/completions", json=BODY)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == OUTPUT
    return Decimal(r.headers["x-service-cost"])


def burst(url: str, key: str, count: int) -> list[httpx.Response]:
    async def go() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=count, max_keepalive_connections=count)
        async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:
            headers = {"authorization": f"Bearer {key}"}
            return list(
                await asyncio.gather(
                    *(client.post("/v1/chat/completions", json=BODY, headers=headers) for _ in range(count))
                )
            )

    return asyncio.run(go())


@pytest.fixture
def gw(backend_gw: Gateway) -> Gateway:
    """These tests run on both store backends (tests/conftest.py)."""
    return backend_gw


def usage_total(gw: Gateway, account_id: str) -> tuple[int, Decimal]:
    costs = [c for (c,) in gw.query("SELECT cost FROM usage_records WHERE account_id = ?", account_id)]
    return len(costs), sum(costs, Decimal(0))


def wait_records(gw: Gateway, account_id: str, count: int) -> int:
    """How many usage records the account has once it has `count` (they land moments after the
    answers), or when time runs out."""
    found: list[int] = []

    def landed() -> bool:
        found.append(usage_total(gw, account_id)[0])
        return found[-1] == count

    with suppress(NeverHappened):  # not in time: the caller's assertion shows how many there are
        eventually(landed, what=f"{count} usage records of {account_id}")
    return found[-1]


def leased(gw: Gateway, account_id: str) -> Decimal:
    """What the worker processes' leases set aside of the account's balance (gateway.funds)."""
    rows = gw.query("SELECT amount FROM leases WHERE kind = 'account' AND pot_id = ?", account_id)
    return sum((amount for (amount,) in rows), Decimal(0))


def wait_leases_back(gw: Gateway, account_id: str) -> None:
    """Until no worker leases any of the account's money: an idle lease goes back after about 2 s
    (LEASE_IDLE_SECONDS and the next housekeeping pass)."""
    eventually(lambda: leased(gw, account_id) == 0, 10, 0.1, what=f"the idle leases of {account_id} back")


def outcomes(responses: list[httpx.Response]) -> Counter[str]:
    return Counter("ok" if r.status_code == 200 else r.json()["error"]["code"] for r in responses)


def test_exactly_k_of_200_fit_the_balance(gw: Gateway) -> None:
    cost = one_cost(gw)
    handle = gw.new_key(balance=str(K * cost))
    answers = burst(gw.url, handle.key, CONCURRENT)
    assert outcomes(answers) == {"ok": K, "insufficient_credits": CONCURRENT - K}
    refused = next(r for r in answers if r.status_code != 200)
    assert refused.status_code == 400 and refused.json()["error"]["type"] == "insufficient_credits"
    assert gw.wait_balance(handle.account_id, Decimal(0)) == 0
    # The usage records add up to the balance's change, to the last digit.
    assert usage_total(gw, handle.account_id) == (K, K * cost)


def test_exactly_k_of_200_fit_the_key_limit(gw: Gateway) -> None:
    cost = one_cost(gw)
    handle = gw.new_key(balance="100", credit_limit=str(K * cost), limit_reset="monthly")
    answers = burst(gw.url, handle.key, CONCURRENT)
    assert outcomes(answers) == {"ok": K, "key_budget_exceeded": CONCURRENT - K}
    assert gw.wait_balance(handle.account_id, 100 - K * cost) == 100 - K * cost
    assert usage_total(gw, handle.account_id) == (K, K * cost)


def test_a_request_whose_estimate_exceeds_the_balance_is_refused_before_it_runs(gw: Gateway) -> None:
    cost = one_cost(gw)
    handle = gw.new_key(balance=str(cost - Decimal("0.000001")))
    with gw.client(handle.key) as c:
        r = c.post("/v1/chat/completions", json=BODY)
        assert r.status_code == 400 and r.json()["error"]["code"] == "insufficient_credits"
        # Without max_tokens the estimate is the model's longest output: far beyond this balance.
        r = c.post("/v1/chat/completions", json={**BODY, "max_tokens": None})
        assert r.json()["error"]["code"] == "insufficient_credits"
        # A smaller request still fits.
        small = {**BODY, "max_tokens": OUTPUT - 2}
        assert c.post("/v1/chat/completions", json=small).status_code == 200
    assert wait_records(gw, handle.account_id, 1) == 1


def test_failed_requests_release_their_holds(gw: Gateway) -> None:
    """A balance for exactly one request: requests that fail upstream (not charged) do not keep
    their holds, so the one that succeeds afterwards still fits."""
    cost = one_cost(gw)
    handle = gw.new_key(balance=str(cost))
    failing = {**BODY, "messages": [{"role": "user", "content": "hold this [sim fail=500]"}]}
    with gw.client(handle.key) as c:
        for _ in range(3):
            assert c.post("/v1/chat/completions", json=failing).status_code >= 500
        assert c.post("/v1/chat/completions", json=BODY).status_code == 200
        assert c.post("/v1/chat/completions", json=BODY).json()["error"]["code"] == "insufficient_credits"


@pytest.mark.slow
def test_two_workers_never_overspend_and_idle_leases_come_back(
    sim_url: str, tmp_path: Path, backend: str
) -> None:
    """With two worker processes, each leases part of the balance: a burst never overspends;
    once the burst is over the idle leases go back, and what is left is spent exactly."""
    models = chat_model(MODEL, "gpt-4o-mini", sim_url)
    with gateway(tmp_path, models, server_toml="workers = 2", backend=backend) as gw2:
        cost = one_cost(gw2)
        handle = gw2.new_key(balance=str(K * cost))
        first = outcomes(burst(gw2.url, handle.key, CONCURRENT))
        assert first["ok"] <= K and first["ok"] + first["insufficient_credits"] == CONCURRENT, first
        wait_leases_back(gw2, handle.account_id)
        # One by one, the requests land on either worker; a refusal while the other worker still
        # leases the rest lasts until that lease goes idle and comes back.
        more, waited = 0, False
        with gw2.client(handle.key) as c:
            while more <= K:
                r = c.post("/v1/chat/completions", json=BODY)
                if r.status_code == 200:
                    more, waited = more + 1, False
                    continue
                assert r.json()["error"]["code"] == "insufficient_credits", r.text
                if waited:
                    break
                wait_leases_back(gw2, handle.account_id)
                waited = True
        assert first["ok"] + more == K, (first, more)
        assert gw2.wait_balance(handle.account_id, Decimal(0)) == 0
        assert usage_total(gw2, handle.account_id) == (K, K * cost)

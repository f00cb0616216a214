"""Per-key rate limits (spec 8): requests and tokens per minute from the account, held across
worker processes through the Rust core's shared buckets, with the x-ratelimit-* headers on every
answer and 429 rate_limited with a correct Retry-After."""

from __future__ import annotations

import asyncio
from collections import Counter
from decimal import Decimal
from pathlib import Path

import httpx
import pytest

from gateway.errors import GatewayError
from gateway.ratelimits import RateLimiter, RateState
from gateway.store import Account, ApiKey, KeyContext
from harness import Gateway, KeyHandle, chat_model, gateway

MODEL = "openai/gpt-4o-mini"
CHAT = "/v1/chat/completions"
SECOND = 1_000_000_000


class Clock:
    def __init__(self) -> None:
        self.ns = 1_800_000_000 * SECOND

    def __call__(self) -> int:
        return self.ns


def ctx(rpm: int | None, tpm: int | None, key_id: str = "key_1") -> KeyContext:
    account = Account("acct_1", "a", Decimal(1), rpm_limit=rpm, tpm_limit=tpm)
    return KeyContext(ApiKey(key_id, "acct_1", "k", "sk-xxxx", 0), account)


def refusal(call: object) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        call()  # type: ignore[operator]
    assert caught.value.code == "rate_limited" and caught.value.status == 429
    return caught.value


def test_requests_per_minute_with_an_injected_clock(tmp_path: Path) -> None:
    clock = Clock()
    limiter = RateLimiter(tmp_path / "rl", clock)
    for left in (2, 1, 0):
        state = limiter.admit(ctx(3, None))
        assert state is not None and state.headers() == {
            "x-ratelimit-limit-requests": "3",
            "x-ratelimit-remaining-requests": str(left),
        }
    err = refusal(lambda: limiter.admit(ctx(3, None)))
    assert err.headers["retry-after"] == "20"  # 3 a minute: one every 20 s
    clock.ns += 19 * SECOND
    refusal(lambda: limiter.admit(ctx(3, None)))
    clock.ns += SECOND
    assert limiter.admit(ctx(3, None)) is not None
    # Another key of the same account has its own bucket; no limits, no state.
    assert limiter.admit(ctx(3, None, key_id="key_2")) is not None
    assert limiter.admit(ctx(None, None)) is None


def test_tokens_are_reserved_then_corrected(tmp_path: Path) -> None:
    clock = Clock()
    limiter = RateLimiter(tmp_path / "rl", clock)
    state = limiter.admit(ctx(10, 1000))
    assert state is not None and state.remaining_tokens == 1000
    limiter.reserve(state, 800)
    assert state.remaining_tokens == 200
    limiter.correct(state, 300)  # used 300 of the 800 held
    limiter.correct(state, 0)  # once only
    assert state.remaining_tokens == 700
    second = limiter.admit(ctx(10, 1000))
    err = refusal(lambda: limiter.reserve(second, 900))
    # 200 missing at 1000 a minute: 12 s. The request it took is given back (it never ran).
    assert err.headers["retry-after"] == "12" and err.headers["x-ratelimit-remaining-requests"] == "9"
    too_big = refusal(lambda: limiter.reserve(limiter.admit(ctx(10, 1000)), 5000))
    assert "lower its max_tokens" in too_big.message


def test_two_limiters_on_one_file_share_the_limit(tmp_path: Path) -> None:
    clock = Clock()
    first, second = RateLimiter(tmp_path / "rl", clock), RateLimiter(tmp_path / "rl", clock)
    admitted = 0
    for i in range(10):
        try:
            (first if i % 2 else second).admit(ctx(4, None))
            admitted += 1
        except GatewayError:
            pass
    assert admitted == 4


def burst(url: str, key: str, count: int, body: dict[str, object]) -> list[httpx.Response]:
    async def go() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            headers = {"authorization": f"Bearer {key}"}
            return list(
                await asyncio.gather(*(client.post(CHAT, json=body, headers=headers) for _ in range(count)))
            )

    return asyncio.run(go())


BODY = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "limit me"}]}


@pytest.mark.slow
def test_two_worker_processes_admit_the_limit_once(sim_url: str, tmp_path: Path) -> None:
    with gateway(tmp_path, chat_model(MODEL, "gpt-4o-mini", sim_url), server_toml="workers = 2") as gw2:
        handle = gw2.new_key(rpm_limit=10)
        answers = burst(gw2.url, handle.key, 30, BODY)
    assert Counter(r.status_code for r in answers) == {200: 10, 429: 20}
    refused = next(r for r in answers if r.status_code == 429)
    assert (
        refused.json()["error"]["code"] == "rate_limited"
        and refused.json()["error"]["type"] == "rate_limit_error"
    )
    assert refused.headers["retry-after"] == "6"  # 10 a minute, all taken at once
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"


def test_headers_on_every_kind_of_answer(gw: Gateway) -> None:
    handle = gw.new_key(rpm_limit=100, tpm_limit=100_000)
    with gw.client(handle.key) as c:
        plain = c.post(CHAT, json=BODY)
        with c.stream("POST", CHAT, json={**BODY, "stream": True}) as streamed:
            streamed.read()
        bad = c.post(CHAT, json={"model": MODEL, "messages": "nope"})
        failed = c.post(CHAT, json={**BODY, "messages": [{"role": "user", "content": "[sim fail=500]"}]})
        embedding = c.post("/v1/embeddings", json={"model": "openai/text-embedding-3-small", "input": "x"})
    for r, status in ((plain, 200), (streamed, 200), (bad, 400), (failed, 502), (embedding, 200)):
        assert r.status_code == status
        assert r.headers["x-ratelimit-limit-requests"] == "100"
        assert r.headers["x-ratelimit-limit-tokens"] == "100000"
        assert int(r.headers["x-ratelimit-remaining-tokens"]) <= 100_000
    assert [int(r.headers["x-ratelimit-remaining-requests"]) for r in (plain, streamed, bad, failed)] == [
        99,
        98,
        97,
        96,
    ]


def test_no_headers_without_limits(gw: Gateway, key: KeyHandle) -> None:
    with gw.client(key.key) as c:
        r = c.post(CHAT, json=BODY)
    assert r.status_code == 200 and not any(h.startswith("x-ratelimit") for h in r.headers)


def test_tokens_per_minute_refuses_then_the_estimate_is_corrected(gw: Gateway) -> None:
    """A limit of 100 tokens a minute: a request estimated at more is refused before it runs; one
    that fits reserves its estimate and is corrected to what it used."""
    handle = gw.new_key(tpm_limit=100)
    with gw.client(handle.key) as c:
        r = c.post(CHAT, json={**BODY, "max_tokens": None})  # the model's longest output: too many
        assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limited"
        assert int(r.headers["retry-after"]) >= 1 and "max_tokens" in r.json()["error"]["message"]
        ok = c.post(CHAT, json=BODY)
        assert ok.status_code == 200
        used = ok.json()["usage"]["total_tokens"]
        # The next answer shows the correction: 100 - used, less what its own estimate reserves.
        after = c.post(CHAT, json=BODY)
    estimate = int(ok.headers["x-ratelimit-remaining-tokens"])
    assert 100 - estimate >= used
    assert int(after.headers["x-ratelimit-remaining-tokens"]) <= 100 - used


def test_state_headers_name_only_the_limits_set() -> None:
    assert set(RateState("k", 5, None).headers()) == {
        "x-ratelimit-limit-requests",
        "x-ratelimit-remaining-requests",
    }
    assert set(RateState("k", None, 7).headers()) == {
        "x-ratelimit-limit-tokens",
        "x-ratelimit-remaining-tokens",
    }

"""Per-key rate limits (spec 8): requests and tokens per minute from the account, held across
worker processes through a shared bucket store (the Rust core's file, or Redis: the limiter's tests
run on both), with the x-ratelimit-* headers on every answer and 429 rate_limited with a correct
Retry-After."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from decimal import Decimal
from pathlib import Path

import httpx
import openai
import pytest

from gateway.buckets import BucketStore, FileBuckets
from gateway.config import load_settings
from gateway.errors import GatewayError
from gateway.estimates import DEFAULT_RESERVED_OUTPUT, TextEstimate
from gateway.pricing import Usage
from gateway.ratelimits import RateLimiter, RateState, reserved_tokens
from gateway.redis_buckets import RedisBuckets
from gateway.redis_client import connect
from gateway.store import Account, ApiKey, KeyContext
from harness import (
    Gateway,
    chat_model,
    eventually,
    forget_redis_keys,
    free_port,
    gateway,
    running,
    wait_until_listening,
)

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


async def refusal(call: Awaitable[object]) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        await call
    assert caught.value.code == "rate_limited" and caught.value.status == 429
    return caught.value


@pytest.fixture(params=["file", "redis"])
def store_kind(request: pytest.FixtureRequest) -> str | None:
    """Where the limiter's buckets live: None for the file, else the test Redis's URL."""
    return None if request.param == "file" else str(request.getfixturevalue("redis_url"))


@asynccontextmanager
async def bucket_stores(redis_url: str | None, tmp_path: Path) -> AsyncIterator[Callable[[], BucketStore]]:
    """Opens the test's bucket store (each call another handle on the same buckets): the file, or
    Redis under a prefix of the test's own, removed afterwards."""
    if redis_url is None:
        yield lambda: FileBuckets(tmp_path / "rl")
        return
    client = connect(redis_url)
    prefix = f"test:rl:{uuid.uuid4().hex}:"
    try:
        yield lambda: RedisBuckets(client, prefix)
    finally:
        await client.aclose()
        forget_redis_keys(prefix + "*", redis_url)


def test_requests_per_minute_with_an_injected_clock(store_kind: str | None, tmp_path: Path) -> None:
    async def go() -> None:
        clock = Clock()
        async with bucket_stores(store_kind, tmp_path) as open_store:
            limiter = RateLimiter(open_store(), clock)
            for left in (2, 1, 0):
                state = await limiter.admit(ctx(3, None))
                assert state is not None and state.headers() == {
                    "x-ratelimit-limit-requests": "3",
                    "x-ratelimit-remaining-requests": str(left),
                }
            err = await refusal(limiter.admit(ctx(3, None)))
            assert err.headers["retry-after"] == "20"  # 3 a minute: one every 20 s
            clock.ns += 19 * SECOND
            await refusal(limiter.admit(ctx(3, None)))
            clock.ns += SECOND
            assert await limiter.admit(ctx(3, None)) is not None
            # Another key of the same account has its own bucket; no limits, no state.
            assert await limiter.admit(ctx(3, None, key_id="key_2")) is not None
            assert await limiter.admit(ctx(None, None)) is None

    asyncio.run(go())


def test_a_raised_limit_applies_to_the_next_request(store_kind: str | None, tmp_path: Path) -> None:
    """Review: an account's limit raised from 6 to 100 requests a minute still refused the next
    requests until its bucket refilled. What was taken stays taken; the rest is there at once."""

    async def go() -> None:
        clock = Clock()
        async with bucket_stores(store_kind, tmp_path) as open_store:
            limiter = RateLimiter(open_store(), clock)
            for _ in range(6):
                await limiter.admit(ctx(6, None))
            await refusal(limiter.admit(ctx(6, None)))
            state = await limiter.admit(ctx(100, None))
            assert state is not None and state.headers()["x-ratelimit-remaining-requests"] == "93"
            # Lowered again, with 7 taken: refused until it is back under 6 (workers that learn of a
            # change at different moments ask under either limit: neither makes tokens).
            await refusal(limiter.admit(ctx(6, None)))
            clock.ns += 10 * SECOND  # 6 a minute: one back, which pays the one over the limit
            await refusal(limiter.admit(ctx(6, None)))
            clock.ns += 10 * SECOND
            assert await limiter.admit(ctx(6, None)) is not None

    asyncio.run(go())


def test_tokens_are_reserved_then_corrected(store_kind: str | None, tmp_path: Path) -> None:
    async def go() -> None:
        clock = Clock()
        async with bucket_stores(store_kind, tmp_path) as open_store:
            limiter = RateLimiter(open_store(), clock)
            state = await limiter.admit(ctx(10, 1000))
            # Admitting takes a request and leaves the tokens to the reservation, unread.
            assert state is not None and state.remaining_tokens is None
            await limiter.tokens_read(state)  # what an answer before the reservation shows
            assert state.remaining_tokens == 1000
            await limiter.reserve(state, Usage(800), "embedding")
            assert state.remaining_tokens == 200
            limiter.correct(state, 300)  # used 300 of the 800 held
            limiter.correct(state, 0)  # once only
            await limiter.corrected(state)
            assert state.remaining_tokens == 700
            second = await limiter.admit(ctx(10, 1000))
            err = await refusal(limiter.reserve(second, Usage(900), "embedding"))
            # 200 missing at 1000 a minute: 12 s. The request it took is given back (it never ran).
            assert err.headers["retry-after"] == "12"
            assert err.headers["x-ratelimit-remaining-requests"] == "9"
            # More than the whole limit can never run: not a 429 (waiting cannot help) but a 400.
            with pytest.raises(GatewayError) as too_big:
                await limiter.reserve(await limiter.admit(ctx(10, 1000)), Usage(5000), "embedding")
            assert too_big.value.code == "invalid_request" and too_big.value.param == "input"
            await limiter.drain()

    asyncio.run(go())


def test_two_limiters_on_one_store_share_the_limit(store_kind: str | None, tmp_path: Path) -> None:
    async def go() -> int:
        clock = Clock()
        async with bucket_stores(store_kind, tmp_path) as open_store:
            first, second = RateLimiter(open_store(), clock), RateLimiter(open_store(), clock)
            admitted = 0
            for i in range(10):
                try:
                    await (first if i % 2 else second).admit(ctx(4, None))
                    admitted += 1
                except GatewayError:
                    pass
            return admitted

    assert asyncio.run(go()) == 4


def burst(url: str, key: str, count: int, body: dict[str, object]) -> list[httpx.Response]:
    async def go() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            headers = {"authorization": f"Bearer {key}"}
            return list(
                await asyncio.gather(*(client.post(CHAT, json=body, headers=headers) for _ in range(count)))
            )

    return asyncio.run(go())


BODY = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "limit me"}]}


def redis_toml(url: str | None) -> str:
    """The [redis] section of a gateway whose buckets are in Redis (under a prefix of its own)."""
    return "" if url is None else f'[redis]\nurl = "{url}"\nprefix = "test-{uuid.uuid4().hex}"\n'


@pytest.mark.slow
def test_two_worker_processes_admit_the_limit_once(
    store_kind: str | None, sim_url: str, tmp_path: Path
) -> None:
    """60 requests at once to a key with 30 a minute, through the 2 worker processes of a gateway
    (on the file, or on Redis as instances share it): 30 admitted, and one more for every 2 s the
    burst took (30 a minute refill one every 2 s); the rest 429."""
    models = redis_toml(store_kind) + chat_model(MODEL, "gpt-4o-mini", sim_url)
    with gateway(tmp_path, models, server_toml="workers = 2") as gw2:
        handle = gw2.new_key(rpm_limit=30)
        started = time.monotonic()
        answers = burst(gw2.url, handle.key, 60, BODY)
        took = time.monotonic() - started
    counts = Counter(r.status_code for r in answers)
    assert set(counts) == {200, 429}
    assert 30 <= counts[200] <= 30 + int(took / 2), (counts, took)
    refused = next(r for r in answers if r.status_code == 429)
    assert (
        refused.json()["error"]["code"] == "rate_limited"
        and refused.json()["error"]["type"] == "rate_limit_error"
    )
    assert refused.headers["retry-after"] in {"1", "2"}  # one request back every 2 s
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"


@pytest.fixture(scope="module")
def redis_gw(redis_url: str, sim_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A gateway whose buckets are in Redis, with the models the tests below ask for."""
    models = redis_toml(redis_url) + chat_model(MODEL, "gpt-4o-mini", sim_url)
    models += chat_model(
        "openai/text-embedding-3-small", "text-embedding-3-small", sim_url, type_="embedding"
    )
    models += chat_model("openai/gpt-4.1-mini", "gpt-4.1-mini", sim_url, type_="responses")
    with gateway(tmp_path_factory.mktemp("redis-gw"), models) as g:
        yield g


@pytest.fixture(params=["file", "redis", "postgres"])
def limits_gw(request: pytest.FixtureRequest) -> Gateway:
    """The session's gateway (SQLite, buckets in the file), one with its buckets in Redis, and the
    session's gateway on PostgreSQL (buckets in Redis, as every instance there: tests/conftest.py)."""
    name = {"file": "gw", "redis": "redis_gw", "postgres": "postgres_gw"}[request.param]
    chosen: Gateway = request.getfixturevalue(name)
    return chosen


def test_headers_on_every_kind_of_answer(limits_gw: Gateway) -> None:
    gw = limits_gw
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


def test_no_headers_without_limits(limits_gw: Gateway) -> None:
    key = limits_gw.new_key()
    with limits_gw.client(key.key) as c:
        r = c.post(CHAT, json=BODY)
    assert r.status_code == 200 and not any(h.startswith("x-ratelimit") for h in r.headers)


def test_tokens_per_minute_reserves_what_the_limit_leaves_then_corrects(limits_gw: Gateway) -> None:
    """A limit of 100 tokens a minute. A request without max_tokens reserves its prompt and what the
    limit leaves beside it (here all of it: less than its default output), so it runs, where it used
    to be refused with 429 forever; when it ends the reservation is corrected to what it used."""
    gw = limits_gw
    handle = gw.new_key(tpm_limit=100)
    with gw.client(handle.key) as c:
        first = c.post(CHAT, json={**BODY, "max_tokens": None})
        assert first.status_code == 200, first.text
        used = first.json()["usage"]["total_tokens"]
        # A plain answer goes out corrected: all 100 were reserved, all but what it used given back.
        assert 100 - used <= int(first.headers["x-ratelimit-remaining-tokens"]) <= 100 - used + 2
        after = c.post(CHAT, json=BODY)  # reserves its prompt and max_tokens = 5
    assert after.status_code == 200, after.text
    prompt = after.json()["usage"]["prompt_tokens"]
    # 100 - used - (prompt + 5), plus what refilled meanwhile (100 a minute: under 2 a second).
    assert 0 <= int(after.headers["x-ratelimit-remaining-tokens"]) <= 100 - used - prompt - 5 + 3


def test_state_headers_name_only_the_limits_set() -> None:
    assert set(RateState("k", 5, None).headers()) == {
        "x-ratelimit-limit-requests",
        "x-ratelimit-remaining-requests",
    }
    assert set(RateState("k", None, 7, remaining_tokens=3).headers()) == {
        "x-ratelimit-limit-tokens",
        "x-ratelimit-remaining-tokens",
    }
    # Tokens not read yet (RateLimiter.tokens_read fills them in before an answer's headers).
    assert set(RateState("k", None, 7).headers()) == {"x-ratelimit-limit-tokens"}


def test_headers_on_answers_that_are_not_model_requests(limits_gw: Gateway) -> None:
    """Spec 8: every answer to a key with limits carries the headers, not only model requests:
    model lists, usage lookups, job polls, unknown ids and paths, wrong methods. Those answers take
    nothing from the key's requests per minute (only model requests count): they show the buckets
    as they stand, and are not refused when the model requests have used them up."""
    gw = limits_gw
    handle = gw.new_key(rpm_limit=2, tpm_limit=100_000)  # one request back every 30 s
    with openai.OpenAI(base_url=gw.openai_base, api_key=handle.key, max_retries=0) as client:
        chat = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5
        )
        assert chat.headers["x-ratelimit-remaining-requests"] == "1"
        listed = client.models.with_raw_response.list()
        assert listed.headers["x-ratelimit-limit-requests"] == "2"
        assert listed.headers["x-ratelimit-remaining-requests"] == "1"
        assert listed.headers["x-ratelimit-limit-tokens"] == "100000"
    usage_id = chat.parse().id
    with gw.client(handle.key) as c:
        deadline = time.monotonic() + 5
        while (usage := c.get(f"/v1/usage/{usage_id}")).status_code == 404 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert usage.status_code == 200
        answers = [
            usage,
            c.get("/v1/models"),
            c.get("/model_group/info"),
            c.get("/model_group/info", params={"model_group": MODEL}),
            c.get("/model_group/info", params={"model_group": "nope/nope"}),
            c.get("/v1/usage/chatcmpl-unknown"),
            c.get("/v1/videos"),
            c.get("/v1/videos/video_unknown"),
            c.get("/v1/videos/video_unknown/content"),
            c.get("/v1/responses/resp_unknown"),
            c.post("/v1/responses/resp_unknown/cancel"),
            c.get("/v1/no-such-path"),
            c.get(CHAT),  # 405
        ]
        statuses = [r.status_code for r in answers]
        assert statuses == [200, 200, 200, 200, 400, 404, 200, 404, 404, 404, 404, 404, 405]
        for r in answers:
            assert r.headers["x-ratelimit-limit-requests"] == "2", r.url
            assert r.headers["x-ratelimit-remaining-requests"] == "1", r.url  # none of them took one
            assert r.headers["x-ratelimit-limit-tokens"] == "100000", r.url
            assert int(r.headers["x-ratelimit-remaining-tokens"]) > 99_000, r.url
        assert c.post(CHAT, json=BODY).headers["x-ratelimit-remaining-requests"] == "0"
        assert c.post(CHAT, json=BODY).status_code == 429
        after = c.get("/v1/models")
        assert after.status_code == 200 and after.headers["x-ratelimit-remaining-requests"] == "0"
    # No valid key, no headers.
    with gw.client("sk-not-a-key") as bad, gw.client(None) as none:
        for r in (bad.get("/v1/models"), bad.get("/v1/no-such-path"), none.get("/v1/models")):
            assert r.status_code in (401, 404) and not any(h.startswith("x-ratelimit") for h in r.headers)


def test_what_a_request_reserves() -> None:
    """reserved_tokens: the output limit when set (400 naming what fits when it never can), else a
    bounded default; a prompt with no room for output is 400 naming where the prompt is."""

    def text(output: int, limit_set: str | None = None, choices: int = 1) -> TextEstimate:
        limits = ("max_completion_tokens", "max_tokens")
        return TextEstimate(100, output * choices, limits=limits, limit_set=limit_set, choices=choices)

    assert reserved_tokens(text(16_384), 10_000, "chat") == 100 + DEFAULT_RESERVED_OUTPUT
    assert reserved_tokens(text(16_384), 500, "chat") == 500  # what the limit leaves
    assert reserved_tokens(text(16_384, choices=3), 10_000, "chat") == 100 + 3 * DEFAULT_RESERVED_OUTPUT
    assert reserved_tokens(text(5_000, "max_tokens"), 10_000, "chat") == 5_100
    assert reserved_tokens(text(9_900, "max_tokens"), 10_000, "chat") == 10_000
    with pytest.raises(GatewayError) as never:
        reserved_tokens(text(9_901, "max_tokens"), 10_000, "chat")
    assert never.value.code == "invalid_request" and never.value.param == "max_tokens"
    assert "at most 9900." in never.value.message
    with pytest.raises(GatewayError) as never:
        reserved_tokens(text(4_000, "max_completion_tokens", choices=3), 10_000, "chat")
    assert never.value.param == "max_completion_tokens" and "at most 3300 for each" in never.value.message
    for tpm in (100, 50):  # no room for a single output token
        with pytest.raises(GatewayError) as never:
            reserved_tokens(text(16_384), tpm, "responses")
        assert never.value.param == "input"
    assert reserved_tokens(Usage(prompt_tokens=1_000), 1_000, "embedding") == 1_000
    with pytest.raises(GatewayError) as never:
        reserved_tokens(Usage(prompt_tokens=1_001), 1_000, "rerank")
    assert never.value.param == "documents"
    # An image request: its prompt and the bounded default of its output tokens.
    assert (
        reserved_tokens(Usage(prompt_tokens=10, completion_tokens=16_384, images=1), 100_000, "image")
        == 1_034
    )


@contextmanager
def throwaway_redis(port: int) -> Iterator[subprocess.Popen[bytes]]:
    """A Redis of the test's own (the shared one must keep running for other tests), no persistence."""
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until_listening(port, proc)
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_redis_going_away_and_coming_back(redis_url: str, sim_url: str, tmp_path: Path) -> None:
    """Redis killed mid-traffic: a key with limits is answered 503 service_unavailable with
    Retry-After, nothing charged; a key without limits keeps working; when Redis is back on the same
    address the gateway admits again by itself, without a restart."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    models = redis_toml(url) + chat_model(MODEL, "gpt-4o-mini", sim_url)
    with throwaway_redis(port) as first, gateway(tmp_path, models, server_toml="workers = 2") as gw2:
        limited, free = gw2.new_key(rpm_limit=1000, tpm_limit=100_000), gw2.new_key()
        with gw2.client(limited.key) as lc, gw2.client(free.key) as fc:
            ran = lc.post(CHAT, json=BODY)
            assert ran.status_code == 200
            assert fc.post(CHAT, json=BODY).status_code == 200
            first.kill()
            first.wait()
            balance = Decimal(100) - Decimal(ran.headers["x-service-cost"])
            assert gw2.wait_balance(limited.account_id, balance) == balance
            for _ in range(4):  # both workers, old connections and new
                down = lc.post(CHAT, json=BODY)
                assert down.status_code == 503, down.text
                assert down.json()["error"]["code"] == "service_unavailable"
                assert down.json()["error"]["type"] == "api_error"
                assert int(down.headers["retry-after"]) >= 1
                assert "x-service-request-id" in down.headers
                assert fc.post(CHAT, json=BODY).status_code == 200
            assert gw2.balance(limited.account_id) == balance  # nothing charged
            with throwaway_redis(port):
                deadline = time.monotonic() + 10
                while (back := lc.post(CHAT, json=BODY)).status_code != 200 and time.monotonic() < deadline:
                    time.sleep(0.1)
                assert back.status_code == 200, back.text
                assert int(back.headers["x-ratelimit-remaining-requests"]) < 1000
                for _ in range(4):
                    assert lc.post(CHAT, json=BODY).status_code == 200


@contextmanager
def blackhole() -> Iterator[int]:
    """A port that takes connections and never answers (a Redis that hangs): its port."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield listener.getsockname()[1]


@pytest.mark.slow
def test_a_redis_that_never_answers_is_waited_for_once(sim_url: str, tmp_path: Path) -> None:
    """A limited key's request while Redis hangs waits for its admission once (0.5 s) and is
    answered 503 without x-ratelimit-* headers: the answer no longer asked Redis for them a second
    time, which doubled the wait (outage review)."""
    with blackhole() as redis_port:
        port = free_port()
        config = tmp_path / "gateway.toml"
        config.write_text(
            f"[server]\nport = {port}\ndrain_notice_seconds = 0\n"
            f'[store]\npath = "{tmp_path / "gw.db"}"\n'
            + redis_toml(f"redis://127.0.0.1:{redis_port}/0")
            + chat_model(MODEL, "gpt-4o-mini", sim_url)
        )
        out = tmp_path / "gateway.log"
        with running(["serve", "--config", str(config)], port, output=out) as proc:
            gw2 = Gateway(f"http://127.0.0.1:{port}", proc, load_settings(config), config)
            limited = gw2.new_key(rpm_limit=1000, tpm_limit=100_000)
            with gw2.client(limited.key) as lc:
                down = lc.post(CHAT, json=BODY)
            assert down.status_code == 503, down.text
            assert down.json()["error"]["code"] == "service_unavailable"
            assert not [name for name in down.headers if name.startswith("x-ratelimit")]
            eventually(lambda: "cannot be checked" in out.read_text(), what="the admission's warning")
            text = out.read_text()
    assert text.count(f"the rate limits of key {limited.key_id} cannot be checked") == 1
    assert f"reading the rate limits of key {limited.key_id}" not in text

"""Channel routing (gateway.routing, spec 7.2, 7.4): failover, retries, concurrency caps, the circuit
breaker, weighted balancing, and what the client, the account and the request log see of them.

Every model here has its own channels, so the health one test teaches the router never leaks into
another. Channels are told apart at the simulator by the upstream model name each sends, and
requests by a unique marker in their message.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from decimal import Decimal
from typing import Any

import httpx
import orjson
import pytest

from harness import Gateway, KeyHandle, eventually, free_port, gateway, request_logs, running, sim_requests

TOKEN_ENV = "GATEWAY_TEST_ADMIN_TOKEN"
TOKEN = "admin-" + "0123456789abcdef" * 3
CHAT = "/v1/chat/completions"
FAILURES_TO_COOL_DOWN = 2
COOLDOWN_SECONDS = 1.0
RETRIES = 2  # the default of [routing] retries
SLOW = "1500ms"  # how long a capped channel's upstream takes to answer

ROUTING = f"""retry_backoff_seconds = 0.01
failures_to_cool_down = {FAILURES_TO_COOL_DOWN}
cooldown_seconds = {COOLDOWN_SECONDS}
"""


def channel(
    name: str,
    upstream: str,
    base_url: str,
    priority: int = 0,
    weight: int = 1,
    max_concurrency: int | None = None,
) -> str:
    cap = "" if max_concurrency is None else f"max_concurrency = {max_concurrency}\n"
    return f"""[[models.channels]]
name = "{name}"
provider = "openai"
base_url = "{base_url}"
model = "{upstream}"
priority = {priority}
weight = {weight}
{cap}"""


def model(name: str, *channels: str) -> str:
    return f"""
[[models]]
name = "{name}"
type = "chat"
[models.prices]
input = "2.50"
output = "10.00"
{"".join(channels)}"""


@pytest.fixture(scope="module")
def dead_port() -> int:
    """A port nothing listens on, until the cooldown test starts a simulator there."""
    port: int = free_port()
    return port


@pytest.fixture(scope="module")
def rgw(sim_url: str, dead_port: int, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    sim = sim_url + "/v1"
    dead = f"http://127.0.0.1:{dead_port}/v1"
    slow = f"gpt-4o-mini+ttft={SLOW}"
    models = "".join(
        [
            model(
                "test/failover",
                channel("broken", "gpt-4o-mini+fail=503", sim, priority=0),
                channel("good", "gpt-4o-mini", sim, priority=1),
            ),
            model(
                "test/failover-stream",
                channel("broken", "gpt-4o-mini+fail=503", sim, priority=0),
                channel("good", "gpt-4o-mini", sim, priority=1),
            ),
            model(
                "test/drop",
                channel("dropping", "gpt-4o-mini+drop_after=2", sim, priority=0),
                channel("good", "gpt-4o-mini", sim, priority=1),
            ),
            model(
                "test/cooldown",
                channel("dead", "gpt-4o-mini", dead, priority=0),
                channel("good", "gpt-4o", sim, priority=1),
            ),
            model(
                "test/single-cap",
                channel("only", slow, sim, max_concurrency=1),
            ),
            model(
                "test/double-cap",
                channel("first", slow, sim, max_concurrency=1),
                channel("second", f"gpt-4o+ttft={SLOW}", sim, max_concurrency=1),
            ),
            model(
                "test/all-fail",
                channel("five-hundred", "gpt-4o-mini+fail=500", sim, priority=0),
                channel("bad-gateway", "gpt-4o-mini+fail=502", sim, priority=1),
            ),
            model(
                "test/refused",
                channel("refused", "gpt-4o-mini+fail=401", sim, priority=0),
                channel("good", "gpt-4o-mini", sim, priority=1),
            ),
            model(
                "test/refused-then-failing",
                channel("refused", "gpt-4o-mini+fail=401", sim, priority=0),
                channel("failing", "gpt-4o-mini+fail=503", sim, priority=1),
            ),
            model(
                "test/failing-then-refused",
                channel("failing", "gpt-4o-mini+fail=503", sim, priority=0),
                channel("refused", "gpt-4o-mini+fail=401", sim, priority=1),
            ),
            model(
                "test/throttled",
                channel("throttled", "gpt-4o-mini+fail=429", sim, priority=0),
                channel("good", "gpt-4o-mini", sim, priority=1),
            ),
            model(
                "test/weighted",
                channel("heavy", "gpt-4o-mini", sim, weight=3),
                channel("light", "gpt-4o", sim, weight=1),
            ),
            model(
                "test/last-channel",
                channel("only", "gpt-4o-mini+fail=503", sim),
            ),
        ]
    )
    models += f'\n[admin]\ntoken_env = "{TOKEN_ENV}"\n'
    with gateway(
        tmp_path_factory.mktemp("routing"),
        models,
        server_toml="workers = 1",
        env={TOKEN_ENV: TOKEN},
        routing_toml=ROUTING,
    ) as g:
        yield g


@pytest.fixture
def admin(rgw: Gateway) -> Iterator[httpx.Client]:
    with rgw.admin(TOKEN) as c:
        yield c


@pytest.fixture
def handle(rgw: Gateway) -> KeyHandle:
    return rgw.new_key()


# ---------------------------------------------------------------- helpers


def marker() -> str:
    return "route-" + uuid.uuid4().hex


def chat_body(model_name: str, mark: str, stream: bool = False, tokens: int = 3) -> dict[str, Any]:
    return {
        "model": model_name,
        "max_tokens": tokens,
        "stream": stream,
        "messages": [{"role": "user", "content": f"{mark} [sim tokens={tokens}]"}],
    }


def upstream_models(sim: httpx.Client, mark: str) -> list[str]:
    """The upstream model name of every request the simulator received for `mark`, oldest first."""
    return [str(body["model"]) for body in sim_requests(sim, mark)]


def log_entries(admin: httpx.Client, key_id: str, count: int = 1) -> list[dict[str, Any]]:
    """The key's newest request log entries, once there are `count`."""
    data = request_logs(admin, key_id, count)
    assert len(data) >= count, data
    return data


def last_attempts(admin: httpx.Client, key_id: str, count: int = 1) -> list[dict[str, Any]]:
    """The attempts of the key's newest request, once the key has `count` logged requests."""
    attempts: list[dict[str, Any]] = log_entries(admin, key_id, count)[0]["attempts"]
    return attempts


def tried(attempts: list[dict[str, Any]]) -> list[tuple[str, str | None, int | None]]:
    return [(a["channel"], a["error"], a["status"]) for a in attempts]


def channels(admin: httpx.Client, model_name: str) -> dict[str, dict[str, Any]]:
    """The model's channels as GET /admin/v1/channels shows them, by name."""
    r = admin.get("/channels")
    assert r.status_code == 200, r.text
    [entry] = [m for m in r.json()["data"] if m["model"] == model_name]
    return {c["name"]: c for c in entry["channels"]}


def wait_in_flight(admin: httpx.Client, model_name: str, count: int) -> None:
    eventually(
        lambda: sum(c["in_flight"] for c in channels(admin, model_name).values()) >= count,
        step=0.01,
        what=lambda: f"{count} requests in flight on {model_name}: {channels(admin, model_name)}",
    )


def usage_cost(gw: Gateway, key: str, usage_id: str) -> Decimal:
    with gw.client(key) as c:

        def found() -> httpx.Response | None:
            r = c.get(f"/v1/usage/{usage_id}")
            return r if r.status_code == 200 else None

        r = eventually(found, what=f"the usage record {usage_id}")
    assert r.status_code == 200, r.text
    return Decimal(str(r.json()["cost"]))


def sse_data(text: str) -> list[str]:
    return [line[len("data: ") :] for line in text.splitlines() if line.startswith("data: ")]


def streamed_text(events: list[str]) -> str:
    out = ""
    for event in events:
        if event == "[DONE]":
            continue
        for choice in orjson.loads(event).get("choices") or []:
            out += (choice.get("delta") or {}).get("content") or ""
    return out


def assert_provider_error(r: httpx.Response) -> None:
    assert 500 <= r.status_code < 600, r.text
    error = r.json()["error"]
    assert (error["code"], error["type"]) == ("provider_error", "api_error")


# ---------------------------------------------------------------- 1. failover


def test_failover_to_the_next_priority_is_charged_once(
    rgw: Gateway, admin: httpx.Client, handle: KeyHandle, sim: httpx.Client
) -> None:
    mark = marker()
    before = rgw.balance(handle.account_id)
    with rgw.client(handle.key) as c:
        r = c.post(CHAT, json=chat_body("test/failover", mark))
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"]
    assert upstream_models(sim, mark) == ["gpt-4o-mini+fail=503", "gpt-4o-mini"]

    charged = Decimal(r.headers["x-service-cost"])
    assert charged > 0
    assert before - rgw.wait_balance(handle.account_id, before - charged) == charged
    assert usage_cost(rgw, handle.key, r.json()["id"]) == charged

    [entry] = log_entries(admin, handle.key_id)
    assert (entry["status"], entry["error_code"], Decimal(entry["cost"])) == (200, None, charged)
    assert tried(entry["attempts"]) == [("broken", "provider_error", 503), ("good", None, None)]
    for attempt in entry["attempts"]:
        assert attempt["started_ms"] > 0 and attempt["duration_ms"] >= 0
    assert entry["attempts"][0]["started_ms"] <= entry["attempts"][1]["started_ms"]


# ---------------------------------------------------------------- 2. streams


def test_a_stream_fails_over_before_its_first_token(
    rgw: Gateway, admin: httpx.Client, handle: KeyHandle, sim: httpx.Client
) -> None:
    mark = marker()
    before = rgw.balance(handle.account_id)
    with (
        rgw.client(handle.key) as c,
        c.stream("POST", CHAT, json=chat_body("test/failover-stream", mark, True)) as r,
    ):
        assert r.status_code == 200
        events = sse_data(r.read().decode())
    assert events[-1] == "[DONE]"
    assert streamed_text(events).strip() and not any('"error"' in e for e in events)
    assert upstream_models(sim, mark) == ["gpt-4o-mini+fail=503", "gpt-4o-mini"]

    [entry] = log_entries(admin, handle.key_id)
    assert (entry["status"], entry["error_code"]) == (200, None)
    assert tried(entry["attempts"]) == [("broken", "provider_error", 503), ("good", None, None)]
    charged = Decimal(entry["cost"])
    assert charged > 0
    assert before - rgw.wait_balance(handle.account_id, before - charged) == charged
    assert usage_cost(rgw, handle.key, orjson.loads(events[0])["id"]) == charged
    assert {c["in_flight"] for c in channels(admin, "test/failover-stream").values()} == {0}


def test_a_stream_is_never_retried_after_its_first_byte(
    rgw: Gateway, admin: httpx.Client, handle: KeyHandle, sim: httpx.Client
) -> None:
    mark = marker()
    with rgw.client(handle.key) as c, c.stream("POST", CHAT, json=chat_body("test/drop", mark, True, 8)) as r:
        assert r.status_code == 200
        events = sse_data(r.read().decode())
    # The two words the channel sent before it broke, then the spec's error chunk, and nothing else.
    assert len(streamed_text(events).split()) == 2
    assert orjson.loads(events[-1])["error"]["code"] == "provider_error"
    assert "[DONE]" not in events
    assert upstream_models(sim, mark) == ["gpt-4o-mini+drop_after=2"]  # not again, nor elsewhere

    [entry] = log_entries(admin, handle.key_id)
    assert (entry["status"], entry["error_code"]) == (200, "provider_error")
    # The attempt broke after its start: its entry says so (routing review: it read as a success).
    assert tried(entry["attempts"]) == [("dropping", "provider_error", 502)]
    assert {c["in_flight"] for c in channels(admin, "test/drop").values()} == {0}


# ---------------------------------------------------------------- 3. circuit breaker


def test_a_failing_channel_cools_down_and_comes_back(
    rgw: Gateway, admin: httpx.Client, handle: KeyHandle, sim: httpx.Client, dead_port: int
) -> None:
    name = "test/cooldown"
    with rgw.client(handle.key) as c:
        for n in range(1, FAILURES_TO_COOL_DOWN + 1):
            assert c.post(CHAT, json=chat_body(name, marker())).status_code == 200
            assert tried(last_attempts(admin, handle.key_id, n)) == [
                ("dead", "provider_error", 502),
                ("good", None, None),
            ]
        assert c.post(CHAT, json=chat_body(name, marker())).status_code == 200
        assert tried(last_attempts(admin, handle.key_id, FAILURES_TO_COOL_DOWN + 1)) == [("good", None, None)]
        health = channels(admin, name)
        assert health["dead"]["state"] == "cooling_down", health
        assert health["good"]["state"] == "healthy", health
        assert 0 < health["dead"]["cooldown_remaining_seconds"] <= COOLDOWN_SECONDS

        with running(["sim", "--port", str(dead_port)], dead_port):
            deadline = time.monotonic() + COOLDOWN_SECONDS + 5
            while channels(admin, name)["dead"]["state"] != "half_open":
                assert time.monotonic() < deadline
                time.sleep(0.05)
            mark = marker()
            assert c.post(CHAT, json=chat_body(name, mark)).status_code == 200
            assert tried(last_attempts(admin, handle.key_id, FAILURES_TO_COOL_DOWN + 2)) == [
                ("dead", None, None)
            ]
            health = channels(admin, name)
            assert health["dead"]["state"] == "healthy", health
            assert health["dead"]["failures_in_a_row"] == 0
    # The probe went to the new simulator, not the session's.
    assert upstream_models(sim, mark) == []


# ---------------------------------------------------------------- 4. concurrency caps


def assert_overloaded(r: httpx.Response) -> None:
    assert r.status_code == 429, r.text
    error = r.json()["error"]
    assert (error["code"], error["type"]) == ("provider_overloaded", "rate_limit_error")
    assert r.headers["retry-after"].isdigit() and int(r.headers["retry-after"]) >= 1


def post_in_thread(pool: ThreadPoolExecutor, gw: Gateway, key: str, body: dict[str, Any]) -> Future[int]:
    def go() -> int:
        with gw.client(key) as c:
            r: httpx.Response = c.post(CHAT, json=body)
        return r.status_code

    return pool.submit(go)


def test_a_channel_at_its_cap_turns_requests_away(
    rgw: Gateway, admin: httpx.Client, sim: httpx.Client
) -> None:
    busy, refused = rgw.new_key(), rgw.new_key()
    before = rgw.balance(refused.account_id)
    with ThreadPoolExecutor(1) as pool:
        first = post_in_thread(pool, rgw, busy.key, chat_body("test/single-cap", marker()))
        wait_in_flight(admin, "test/single-cap", 1)
        mark = marker()
        with rgw.client(refused.key) as c:
            r = c.post(CHAT, json=chat_body("test/single-cap", mark))
        assert_overloaded(r)
        assert first.result() == 200
    assert upstream_models(sim, mark) == []
    [entry] = log_entries(admin, refused.key_id)
    assert (entry["status"], entry["error_code"], entry["cost"], entry["usage_id"]) == (
        429,
        "provider_overloaded",
        None,
        None,
    )
    assert rgw.balance(refused.account_id) == before


def test_two_capped_channels_take_two_requests(rgw: Gateway, admin: httpx.Client, sim: httpx.Client) -> None:
    busy, refused = rgw.new_key(), rgw.new_key()
    before = rgw.balance(refused.account_id)
    mark = marker()
    with ThreadPoolExecutor(2) as pool:
        running_ = [post_in_thread(pool, rgw, busy.key, chat_body("test/double-cap", mark)) for _ in range(2)]
        wait_in_flight(admin, "test/double-cap", 2)
        with rgw.client(refused.key) as c:
            assert_overloaded(c.post(CHAT, json=chat_body("test/double-cap", marker())))
        assert [f.result() for f in running_] == [200, 200]
    # One on each channel.
    assert sorted(upstream_models(sim, mark)) == [f"gpt-4o+ttft={SLOW}", f"gpt-4o-mini+ttft={SLOW}"]
    log_entries(admin, refused.key_id)
    assert rgw.balance(refused.account_id) == before


# ---------------------------------------------------------------- 5. nothing works


def test_when_every_channel_fails_nothing_is_charged(
    rgw: Gateway, admin: httpx.Client, handle: KeyHandle, sim: httpx.Client
) -> None:
    mark = marker()
    before = rgw.balance(handle.account_id)
    with rgw.client(handle.key) as c:
        r = c.post(CHAT, json=chat_body("test/all-fail", mark))
    assert_provider_error(r)
    [entry] = log_entries(admin, handle.key_id)
    assert (entry["status"], entry["error_code"], entry["cost"]) == (r.status_code, "provider_error", None)
    attempts = tried(entry["attempts"])
    assert len(attempts) == 1 + RETRIES
    # Both channels before either is tried again, best priority first.
    assert [a[0] for a in attempts[:2]] == ["five-hundred", "bad-gateway"]
    assert all(error == "provider_error" for _, error, _ in attempts)
    assert len(upstream_models(sim, mark)) == 1 + RETRIES
    assert rgw.balance(handle.account_id) == before


# ---------------------------------------------------------------- 6. refused by the upstream


def test_a_refused_channel_is_not_retried(
    rgw: Gateway, admin: httpx.Client, handle: KeyHandle, sim: httpx.Client
) -> None:
    mark = marker()
    with rgw.client(handle.key) as c:
        r = c.post(CHAT, json=chat_body("test/refused", mark))
    assert r.status_code == 200, r.text
    assert upstream_models(sim, mark) == ["gpt-4o-mini+fail=401", "gpt-4o-mini"]
    assert tried(last_attempts(admin, handle.key_id)) == [
        ("refused", "provider_error", 502),
        ("good", None, None),
    ]


def test_a_refused_channel_is_not_retried_when_the_other_one_fails_too(
    rgw: Gateway, admin: httpx.Client, handle: KeyHandle, sim: httpx.Client
) -> None:
    mark = marker()
    with rgw.client(handle.key) as c:
        r = c.post(CHAT, json=chat_body("test/refused-then-failing", mark))
    assert_provider_error(r)
    attempts = tried(last_attempts(admin, handle.key_id))
    assert attempts[0] == ("refused", "provider_error", 502)
    # Retries stay on the channel that can still answer; the refused one is asked once.
    assert attempts[1:] == [("failing", "provider_error", 503)] * RETRIES, attempts
    assert upstream_models(sim, mark).count("gpt-4o-mini+fail=401") == 1
    assert r.status_code == 503


def test_a_refused_backup_does_not_use_up_the_retries_of_a_failing_channel(
    rgw: Gateway, admin: httpx.Client, handle: KeyHandle, sim: httpx.Client
) -> None:
    mark = marker()
    with rgw.client(handle.key) as c:
        r = c.post(CHAT, json=chat_body("test/failing-then-refused", mark))
    assert_provider_error(r)
    attempts = tried(last_attempts(admin, handle.key_id))
    assert attempts == [
        ("failing", "provider_error", 503),
        ("refused", "provider_error", 502),
        ("failing", "provider_error", 503),
    ], attempts
    assert r.status_code == 503


def test_an_upstream_429_moves_the_request_on_and_makes_its_channel_busy(
    rgw: Gateway, admin: httpx.Client, handle: KeyHandle, sim: httpx.Client
) -> None:
    name = "test/throttled"
    mark = marker()
    with rgw.client(handle.key) as c:
        assert c.post(CHAT, json=chat_body(name, mark)).status_code == 200
        assert upstream_models(sim, mark) == ["gpt-4o-mini+fail=429", "gpt-4o-mini"]
        assert tried(last_attempts(admin, handle.key_id)) == [
            ("throttled", "provider_overloaded", 429),
            ("good", None, None),
        ]
        assert channels(admin, name)["throttled"]["state"] == "busy"
        # While it is busy (its Retry-After), requests go straight to the other channel.
        assert c.post(CHAT, json=chat_body(name, marker())).status_code == 200
        assert tried(last_attempts(admin, handle.key_id, 2)) == [("good", None, None)]


# ---------------------------------------------------------------- 7. weights


def test_weights_split_the_traffic(rgw: Gateway, handle: KeyHandle, sim: httpx.Client) -> None:
    mark = marker()
    total = 200
    with rgw.client(handle.key) as c:
        for i in range(total):
            body = chat_body("test/weighted", f"{mark}-{i}", tokens=1)
            assert c.post(CHAT, json=body).status_code == 200
    split = Counter(upstream_models(sim, mark))
    assert sum(split.values()) == total
    # Binomial(200, 3/4): mean 150, standard deviation about 6.1; this bound is about 5 of them.
    assert 120 <= split["gpt-4o-mini"] <= 180, split


# ---------------------------------------------------------------- 8. the last channel


def test_the_last_channel_is_never_cooled_down(
    rgw: Gateway, admin: httpx.Client, handle: KeyHandle, sim: httpx.Client
) -> None:
    name = "test/last-channel"
    with rgw.client(handle.key) as c:
        for _ in range(FAILURES_TO_COOL_DOWN + 1):
            assert_provider_error(c.post(CHAT, json=chat_body(name, marker())))
        mark = marker()
        r = c.post(CHAT, json=chat_body(name, mark))
    assert_provider_error(r)
    assert r.status_code == 503
    assert len(upstream_models(sim, mark)) == 1 + RETRIES
    assert tried(last_attempts(admin, handle.key_id, FAILURES_TO_COOL_DOWN + 2)) == [
        ("only", "provider_error", 503)
    ] * (1 + RETRIES)
    health = channels(admin, name)["only"]
    assert health["state"] == "healthy", health
    assert health["failures_in_a_row"] == (FAILURES_TO_COOL_DOWN + 2) * (1 + RETRIES)


def test_a_channel_that_never_answers_times_out_as_a_failure_and_cools_down(
    sim_url: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A channel that takes the connection and never answers: each attempt gives up after [routing]
    attempt_timeout_seconds, counts against the channel and moves on, so the channel cools down.
    Alone, its attempt still ends before the synchronous window, recorded as the channel's timeout."""
    sim = sim_url + "/v1"
    models = model(
        "test/hanging",
        channel("hanging", "gpt-4o-mini+ttft=30s", sim, priority=0),
        channel("good", "gpt-4o-mini", sim, priority=1),
    ) + model("test/hanging-alone", channel("only", "gpt-4o-mini+ttft=30s", sim))
    models += f'\n[admin]\ntoken_env = "{TOKEN_ENV}"\n'
    with gateway(
        tmp_path_factory.mktemp("hanging"),
        models,
        limits_toml="sync_timeout_seconds = 2",
        env={TOKEN_ENV: TOKEN},
        routing_toml=ROUTING + "attempt_timeout_seconds = 0.5\n",
    ) as g:
        handle = g.new_key()
        with g.admin(TOKEN) as admin, g.client(handle.key) as c:
            for i in range(FAILURES_TO_COOL_DOWN):
                r = c.post(CHAT, json=chat_body("test/hanging", marker()))
                assert r.status_code == 200, r.text
                assert tried(last_attempts(admin, handle.key_id, i + 1)) == [
                    ("hanging", "timeout", 504),
                    ("good", None, None),
                ]
            assert channels(admin, "test/hanging")["hanging"]["state"] == "cooling_down"
            r = c.post(CHAT, json=chat_body("test/hanging", marker()))
            assert r.status_code == 200
            assert tried(last_attempts(admin, handle.key_id, FAILURES_TO_COOL_DOWN + 1)) == [
                ("good", None, None)
            ]

            r = c.post(CHAT, json=chat_body("test/hanging-alone", marker()))
            assert r.status_code == 504 and r.json()["error"]["code"] == "timeout"
            attempts = tried(last_attempts(admin, handle.key_id, FAILURES_TO_COOL_DOWN + 2))
            assert attempts and all(a == ("only", "timeout", 504) for a in attempts)
            assert channels(admin, "test/hanging-alone")["only"]["failures"] == len(attempts)

"""The router's rules on their own (gateway.routing), with a hand-moved clock and no network: which
channel is chosen, when a request is retried or moved, the circuit breaker and the caps."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Callable

import pytest

from gateway.config import ChannelConfig, ModelConfig, RoutingSettings
from gateway.errors import GatewayError
from gateway.routing import Attempt, Router, Slot

SETTINGS = RoutingSettings(
    retries=2,
    retry_backoff_seconds=0.5,
    retry_backoff_max_seconds=4,
    failures_to_cool_down=2,
    cooldown_seconds=30,
)


def channel(name: str, weight: int = 1, priority: int = 0, cap: int | None = None) -> ChannelConfig:
    return ChannelConfig(
        "openai",
        f"http://{name}.test/v1",
        "m",
        name=name,
        weight=weight,
        priority=priority,
        max_concurrency=cap,
    )


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def make(*channels: ChannelConfig, settings: RoutingSettings = SETTINGS) -> tuple[Router, ModelConfig, Clock]:
    model = ModelConfig("a/model", "chat", channels)
    clock = Clock()
    return Router((model,), settings, 1, clock, clock.sleep), model, clock


def upstream_5xx() -> GatewayError:
    return GatewayError("provider_error", "boom", status=503, retry="any")


def answers(failing: set[str], calls: list[str]) -> Callable[[ChannelConfig], asyncio.Future[str]]:
    """An attempt that fails with a 503 on the `failing` channels and answers on the others."""

    def attempt(ch: ChannelConfig) -> asyncio.Future[str]:
        calls.append(ch.name)
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        if ch.name in failing:
            future.set_exception(upstream_5xx())
        else:
            future.set_result(ch.name)
        return future

    return attempt


def run(
    router: Router, model: ModelConfig, failing: set[str], only: ChannelConfig | None = None
) -> list[str]:
    """The channels one request was tried on; raises what the client would get."""
    calls: list[str] = []

    async def go() -> None:
        _, slot = await router.run(model, answers(failing, calls), [], only)
        slot.release()

    asyncio.run(go())
    return calls


def test_weighted_choice_within_the_best_priority() -> None:
    random.seed(7)
    router, model, _ = make(channel("a", weight=3), channel("b", weight=1), channel("backup", priority=1))
    picks = Counter(run(router, model, set())[0] for _ in range(4000))
    assert picks["backup"] == 0
    assert 2800 < picks["a"] < 3200 and picks["a"] + picks["b"] == 4000


def test_a_failure_moves_to_an_untried_channel_without_waiting() -> None:
    router, model, clock = make(channel("a"), channel("b", priority=1))
    assert run(router, model, {"a"}) == ["a", "b"]
    assert clock.slept == []


def test_the_same_channel_is_retried_after_a_jittered_exponential_backoff() -> None:
    random.seed(1)
    router, model, clock = make(channel("only"))
    with pytest.raises(GatewayError) as raised:
        run(router, model, {"only"})
    assert raised.value.code == "provider_error" and raised.value.status == 503
    assert len(clock.slept) == 2  # 1 try + 2 retries
    assert 0 <= clock.slept[0] <= 0.5 and 0 <= clock.slept[1] <= 1.0


def test_errors_of_the_request_are_not_retried() -> None:
    router, model, _ = make(channel("a"), channel("b"))
    calls: list[str] = []

    async def attempt(ch: ChannelConfig) -> str:
        calls.append(ch.name)
        raise GatewayError("invalid_request", "the model refused the request")

    with pytest.raises(GatewayError, match="refused"):
        asyncio.run(router.run(model, attempt, []))
    assert len(calls) == 1
    assert all(c["state"] == "healthy" and c["failures"] == 0 for c in router.health()["a/model"])


def test_an_upstream_429_moves_on_but_never_retries_its_channel() -> None:
    router, model, clock = make(channel("a"), channel("b", priority=1))
    calls: list[str] = []

    async def attempt(ch: ChannelConfig) -> str:
        calls.append(ch.name)
        raise GatewayError("provider_overloaded", "busy", headers={"retry-after": "7"}, retry="other")

    with pytest.raises(GatewayError) as raised:
        asyncio.run(router.run(model, attempt, []))
    assert calls == ["a", "b"] and raised.value.code == "provider_overloaded"
    states = {c["name"]: c["state"] for c in router.health()["a/model"]}
    assert states["a"] == "busy"  # b could take a's traffic; b had nowhere to send it
    assert states["b"] == "healthy"
    clock.now += 8
    assert {c["state"] for c in router.health()["a/model"]} == {"healthy"}


def test_a_failing_channel_cools_down_and_a_probe_brings_it_back() -> None:
    router, model, clock = make(channel("flaky"), channel("steady", priority=1))
    assert run(router, model, {"flaky"}) == ["flaky", "steady"]
    assert run(router, model, {"flaky"}) == ["flaky", "steady"]  # second failure in a row: cooled down
    health = {c["name"]: c for c in router.health()["a/model"]}
    assert health["flaky"]["state"] == "cooling_down" and health["flaky"]["cooldown_remaining_seconds"] == 30
    assert run(router, model, {"flaky"}) == ["steady"]
    clock.now += 31
    assert {c["name"]: c["state"] for c in router.health()["a/model"]}["flaky"] == "half_open"
    assert run(router, model, {"flaky"}) == ["flaky", "steady"]  # the probe failed: cooled down again
    assert run(router, model, set()) == ["steady"]
    clock.now += 31
    assert run(router, model, set()) == ["flaky"]  # the probe succeeded
    assert {c["state"] for c in router.health()["a/model"]} == {"healthy"}


def test_only_one_probe_goes_through_a_half_open_channel() -> None:
    router, model, clock = make(channel("flaky"), channel("steady", priority=1))
    run(router, model, {"flaky"})
    run(router, model, {"flaky"})
    clock.now += 31
    release = asyncio.Event()
    seen: list[str] = []

    async def attempt(ch: ChannelConfig) -> str:
        seen.append(ch.name)
        if ch.name == "flaky":
            await release.wait()
        return ch.name

    async def go() -> None:
        probe = asyncio.ensure_future(router.run(model, attempt, []))
        await asyncio.sleep(0)
        other, slot = await router.run(model, attempt, [])
        slot.release()
        assert other == "steady"
        release.set()
        answer, slot = await probe
        slot.release()
        assert answer == "flaky"

    asyncio.run(go())
    assert seen == ["flaky", "steady", "flaky"][: len(seen)] and seen.count("flaky") == 1


def test_the_last_usable_channel_is_never_cooled_down() -> None:
    router, model, _ = make(channel("only"))
    for _ in range(5):
        with pytest.raises(GatewayError):
            run(router, model, {"only"})
    [health] = router.health()["a/model"]
    assert health["state"] == "healthy" and health["failures_in_a_row"] == 15
    assert run(router, model, set()) == ["only"]


def test_every_channel_at_its_cap_is_provider_overloaded_until_a_slot_is_released() -> None:
    router, model, _ = make(channel("a", cap=1), channel("b", cap=2))

    async def attempt(ch: ChannelConfig) -> str:
        return ch.name

    async def go() -> tuple[list[Slot], GatewayError]:
        slots = [(await router.run(model, attempt, []))[1] for _ in range(3)]
        with pytest.raises(GatewayError) as raised:
            await router.run(model, attempt, [])
        return slots, raised.value

    slots, refused = asyncio.run(go())
    assert refused.code == "provider_overloaded" and refused.status == 429
    assert refused.headers["retry-after"] == "1"
    assert sorted(s.channel.name for s in slots) == ["a", "b", "b"]
    slots[0].release()
    slots[0].release()  # twice changes nothing
    assert run(router, model, set()) == [slots[0].channel.name]


def test_a_cap_is_shared_out_among_the_workers() -> None:
    model = ModelConfig("a/model", "chat", (channel("a", cap=10), channel("b", cap=1)))
    caps = {c["name"]: c["max_concurrency"] for c in Router((model,), SETTINGS, 4).health()["a/model"]}
    assert caps == {"a": 2, "b": 1}


def test_a_pinned_request_stays_on_its_channel() -> None:
    router, model, _ = make(channel("a"), channel("b"))
    with pytest.raises(GatewayError):
        run(router, model, {"b"}, only=model.channels[1])
    [a, b] = router.health()["a/model"]
    # Two failures in a row cooled b down for others (a serves them), yet the pinned request, with
    # nowhere else to go, used all its tries there.
    assert a["attempts"] == 0 and b["attempts"] == 3 and b["state"] == "cooling_down"


def test_a_pinned_request_passes_a_cooling_breaker() -> None:
    """A Responses turn whose state lives on a cooled-down channel is sent there, not refused with
    429; its success brings the channel back."""
    router, model, _ = make(channel("a"), channel("b"))
    assert run(router, model, {"b"}, only=None) in (["b", "a"], ["a"])
    while {c["name"]: c["state"] for c in router.health()["a/model"]}["b"] != "cooling_down":
        run(router, model, {"b"})
    assert run(router, model, set()) == ["a"]  # others keep away from it
    assert run(router, model, set(), only=model.channels[1]) == ["b"]
    assert {c["state"] for c in router.health()["a/model"]} == {"healthy"}


def test_a_pinned_request_passes_a_busy_mark() -> None:
    """Routing review: a channel an upstream 429 marked busy answered a Responses turn whose state
    lives there with the gateway's own 429 "every channel at capacity", without asking it, while
    the upstream would have answered: it has nowhere else to go, as under a cooling breaker."""
    router, model, clock = make(channel("a"), channel("b", priority=1))

    async def overloaded_on_b(ch: ChannelConfig) -> str:
        if ch.name == "b":
            raise GatewayError("provider_overloaded", "busy", headers={"retry-after": "15"}, retry="other")
        return ch.name

    async def go() -> None:
        _, slot = await router.run(model, overloaded_on_b, [], model.channels[1])
        slot.release()

    with pytest.raises(GatewayError):
        asyncio.run(go())
    assert {c["name"]: c["state"] for c in router.health()["a/model"]}["b"] == "busy"
    clock.now += 1
    assert run(router, model, set(), only=model.channels[1]) == ["b"]


def test_attempts_are_recorded_for_the_request_log() -> None:
    router, model, _ = make(channel("a"), channel("b", priority=1))
    attempts: list[Attempt] = []

    async def go() -> None:
        _, slot = await router.run(model, answers({"a"}, []), attempts)
        slot.release()

    asyncio.run(go())
    assert [(a.channel, a.error, a.status) for a in attempts] == [
        ("a", "provider_error", 503),
        ("b", None, None),
    ]


def test_a_request_that_may_have_reached_the_upstream_is_never_sent_twice() -> None:
    """retry "never" (a job creation cut off after it was sent): no retry, no failover, yet the
    failure counts against its channel."""
    router, model, _ = make(channel("a"), channel("b", priority=1))
    calls: list[str] = []

    async def attempt(ch: ChannelConfig) -> str:
        calls.append(ch.name)
        raise GatewayError("provider_error", "cut off", retry="never")

    with pytest.raises(GatewayError):
        asyncio.run(router.run(model, attempt, []))
    assert calls == ["a"]
    health = {c["name"]: c for c in router.health()["a/model"]}
    assert health["a"]["failures"] == 1 and health["a"]["failures_in_a_row"] == 1

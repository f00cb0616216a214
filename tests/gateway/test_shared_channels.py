"""Channel caps and circuit breakers shared through Redis (gateway.shared_channels), on the real
Redis: several routers stand for the processes of several instances. Each test has keys of its own
(a unique prefix). Whole gateways sharing one Redis are in test_shared_routing.py."""

from __future__ import annotations

import asyncio
import logging
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager

import pytest

from gateway.config import ChannelConfig, ModelConfig, RoutingSettings
from gateway.errors import GatewayError
from gateway.redis_client import RedisClient, connect
from gateway.routing import Router, Slot
from gateway.shared_channels import FRESH_SECONDS, SharedChannels
from harness import eventually_async, free_port

SETTINGS = RoutingSettings(
    retries=2,
    retry_backoff_seconds=0.01,
    retry_backoff_max_seconds=0.02,
    failures_to_cool_down=3,
    cooldown_seconds=30,
)


def channel(name: str, priority: int = 0, cap: int | None = None) -> ChannelConfig:
    return ChannelConfig(
        "openai", f"http://{name}.test/v1", "m", name=name, priority=priority, max_concurrency=cap
    )


def upstream_5xx() -> GatewayError:
    return GatewayError("provider_error", "boom", status=503, retry="any")


@asynccontextmanager
async def processes(
    url: str, model: ModelConfig, count: int = 2, workers: int = 1, **shared: float
) -> AsyncIterator[list[Router]]:
    """`count` routers sharing one key prefix in Redis, each with its own client, like processes."""
    prefix = f"test:{uuid.uuid4().hex}:"
    clients: list[RedisClient] = [connect(url) for _ in range(count)]
    routers = [
        Router((model,), SETTINGS, workers, shared=SharedChannels(c, prefix=prefix, **shared))
        for c in clients
    ]
    try:
        yield routers
    finally:
        for router in routers:
            await router.close()
        for c in clients:
            await c.aclose()


def answering(
    failing: frozenset[str] | set[str] = frozenset(), calls: list[str] | None = None
) -> Callable[[ChannelConfig], Awaitable[str]]:
    async def attempt(ch: ChannelConfig) -> str:
        if calls is not None:
            calls.append(ch.name)
        if ch.name in failing:
            raise upstream_5xx()
        return ch.name

    return attempt


async def take(
    router: Router, model: ModelConfig, failing: frozenset[str] | set[str] = frozenset()
) -> tuple[str, Slot]:
    return await router.run(model, answering(failing), [])


async def until_shown(router: Router, name: str, field: str, value: object) -> None:
    """Until `router`'s report (the deployment's view, from Redis) shows `value` for the channel:
    slots and breaker changes are written there in the background, moments after the call."""

    async def shown() -> bool:
        return by_name(await router.report(), "a/model")[name][field] == value

    await eventually_async(shown, what=f"{name}'s {field} at {value!r}")


async def tried(router: Router, model: ModelConfig, failing: set[str]) -> list[str]:
    calls: list[str] = []
    _, slot = await router.run(model, answering(failing, calls), [])
    slot.release()
    return calls


def by_name(report: dict[str, list[dict[str, object]]], model: str) -> dict[str, dict[str, object]]:
    return {str(c["name"]): c for c in report[model]}


def test_a_cap_is_one_count_across_processes(redis_url: str) -> None:
    model = ModelConfig("a/model", "chat", (channel("only", cap=2),))

    async def go() -> None:
        # Four workers each: locally the cap would be split to 1 per worker, 2 per router.
        async with processes(redis_url, model, workers=4) as (a, b):
            _, first = await take(a, model)
            _, second = await take(b, model)
            for router in (a, b):
                with pytest.raises(GatewayError) as refused:
                    await take(router, model)
                assert refused.value.code == "provider_overloaded" and refused.value.status == 429
            [shown] = (await a.report())["a/model"]
            assert (shown["in_flight"], shown["max_concurrency"], shown["state"], shown["shared"]) == (
                2,
                2,
                "at_capacity",
                True,
            )
            first.release()
            first.release()  # twice gives back one slot
            await until_shown(b, "only", "in_flight", 1)  # the slot goes back in the background
            _, third = await take(b, model)
            with pytest.raises(GatewayError):
                await take(a, model)
            second.release()
            third.release()
            await until_shown(b, "only", "in_flight", 0)
            assert by_name(await b.report(), "a/model")["only"]["in_flight"] == 0

    asyncio.run(go())


def test_a_channel_failing_on_one_process_is_cooled_down_on_the_others(redis_url: str) -> None:
    model = ModelConfig("a/model", "chat", (channel("flaky"), channel("steady", priority=1)))

    async def go() -> None:
        async with processes(redis_url, model, count=3) as (a, b, c):
            # Failures in a row count across processes: one on each makes three.
            assert await tried(a, model, {"flaky"}) == ["flaky", "steady"]
            assert await tried(b, model, {"flaky"}) == ["flaky", "steady"]
            assert by_name(await c.report(), "a/model")["flaky"]["state"] == "healthy"
            assert await tried(c, model, {"flaky"}) == ["flaky", "steady"]
            for router in (a, b, c):
                shown = by_name(await router.report(), "a/model")["flaky"]
                assert shown["state"] == "cooling_down" and shown["failures_in_a_row"] == 3
                assert 29 < float(str(shown["cooldown_remaining_seconds"])) <= 30
                assert await tried(router, model, set()) == ["steady"]

    asyncio.run(go())


def test_an_answer_anywhere_resets_the_failures_in_a_row(redis_url: str) -> None:
    model = ModelConfig("a/model", "chat", (channel("flaky"), channel("steady", priority=1)))

    async def go() -> None:
        async with processes(redis_url, model) as (a, b):
            await tried(a, model, {"flaky"})
            await tried(a, model, {"flaky"})
            assert await tried(b, model, set()) == ["flaky"]
            await until_shown(a, "flaky", "failures_in_a_row", 0)
            assert by_name(await a.report(), "a/model")["flaky"]["failures_in_a_row"] == 0
            await tried(a, model, {"flaky"})
            assert by_name(await b.report(), "a/model")["flaky"]["state"] == "healthy"

    asyncio.run(go())


def test_one_probe_in_the_whole_deployment_and_its_answer_reopens_the_channel(redis_url: str) -> None:
    settings_cool = RoutingSettings(
        retries=2, retry_backoff_seconds=0.01, failures_to_cool_down=1, cooldown_seconds=0.2
    )
    model = ModelConfig("a/model", "chat", (channel("flaky"), channel("steady", priority=1)))

    async def go() -> None:
        prefix = f"test:{uuid.uuid4().hex}:"
        clients = [connect(redis_url), connect(redis_url)]
        a, b = (Router((model,), settings_cool, 1, shared=SharedChannels(c, prefix=prefix)) for c in clients)
        try:
            assert await tried(a, model, {"flaky"}) == ["flaky", "steady"]
            assert await tried(b, model, {"flaky"}) == ["steady"]
            await asyncio.sleep(0.25)  # past the 0.2 s cool-down: the window the test is about
            assert by_name(await b.report(), "a/model")["flaky"]["state"] == "half_open"
            release = asyncio.Event()
            seen: list[str] = []

            async def slow_probe(ch: ChannelConfig) -> str:
                seen.append(ch.name)
                if ch.name == "flaky":
                    await release.wait()
                return ch.name

            probe = asyncio.ensure_future(a.run(model, slow_probe, []))

            async def probing() -> bool:
                return "flaky" in seen

            await eventually_async(probing, what="a's probe under way")
            answer, slot = await b.run(model, slow_probe, [])  # the probe is a's: b goes elsewhere
            assert answer == "steady"
            slot.release()
            release.set()
            answer, slot = await probe
            slot.release()
            assert answer == "flaky" and seen.count("flaky") == 1
            await until_shown(b, "flaky", "state", "healthy")
            assert by_name(await b.report(), "a/model")["flaky"]["state"] == "healthy"
            # b was told of a's probe: it asks Redis again within FRESH_SECONDS (waited out here).
            await asyncio.sleep(FRESH_SECONDS)
            assert await tried(b, model, set()) == ["flaky"]
        finally:
            for router in (a, b):
                await router.close()
            for c in clients:
                await c.aclose()

    asyncio.run(go())


def test_the_last_usable_channel_is_never_cooled_down(redis_url: str) -> None:
    model = ModelConfig("a/model", "chat", (channel("only"),))

    async def go() -> None:
        async with processes(redis_url, model) as (a, b):
            for router in (a, b, a):
                with pytest.raises(GatewayError):
                    await tried(router, model, {"only"})
            shown = by_name(await b.report(), "a/model")["only"]
            assert shown["state"] == "healthy" and shown["failures_in_a_row"] == 9
            assert await tried(b, model, set()) == ["only"]

    asyncio.run(go())


def test_an_upstream_429_makes_its_channel_busy_everywhere(redis_url: str) -> None:
    model = ModelConfig("a/model", "chat", (channel("throttled"), channel("good", priority=1)))

    async def go() -> None:
        async with processes(redis_url, model) as (a, b):

            async def attempt(ch: ChannelConfig) -> str:
                if ch.name == "throttled":
                    raise GatewayError(
                        "provider_overloaded", "slow down", headers={"retry-after": "20"}, retry="other"
                    )
                return ch.name

            answer, slot = await a.run(model, attempt, [])
            slot.release()
            assert answer == "good"
            assert by_name(await b.report(), "a/model")["throttled"]["state"] == "busy"
            assert await tried(b, model, set()) == ["good"]

    asyncio.run(go())


def test_a_dead_process_slots_come_back_when_their_leases_run_out(redis_url: str) -> None:
    model = ModelConfig("a/model", "chat", (channel("only", cap=1),))

    async def go() -> None:
        async with processes(redis_url, model, lease_seconds=0.4, renew_seconds=0.1) as (a, b):
            _, held = await take(a, model)
            # Renewed while its process lives: well past the lease, the slot is still taken.
            await asyncio.sleep(0.8)
            with pytest.raises(GatewayError):
                await take(b, model)
            # The process dies holding it (nothing renews it, nothing gives it back).
            shared = a._shared
            assert shared is not None and shared._renewer is not None
            shared._renewer.cancel()
            await asyncio.sleep(0.5)  # past the 0.4 s lease, which nothing renews now
            _, slot = await take(b, model)
            slot.release()
            del held

    asyncio.run(go())


class ThrowawayRedis:
    """A private redis-server on a free port, started and killed by the test (never the shared one)."""

    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.port = free_port()
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--bind",
            "127.0.0.1",
        ]
        self.procs.append(subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture
def throwaway_redis() -> Iterator[ThrowawayRedis]:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed")
    server = ThrowawayRedis(binary)
    try:
        yield server
    finally:
        server.kill()


async def wait_for_port(port: int, seconds: float = 5.0) -> None:
    async def listening() -> bool:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            return False
        writer.close()
        return True

    await eventually_async(listening, seconds, what=f"something on port {port}")


def test_without_redis_the_local_view_serves_and_the_shared_one_comes_back(
    throwaway_redis: ThrowawayRedis, caplog: pytest.LogCaptureFixture
) -> None:
    port = throwaway_redis.port
    model = ModelConfig("a/model", "chat", (channel("only", cap=4), channel("other", priority=1)))

    async def go() -> None:
        throwaway_redis.start()
        await wait_for_port(port)
        async with processes(f"redis://127.0.0.1:{port}/0", model, workers=2, reconnect_seconds=0.1) as (
            a,
            b,
        ):
            shared_a = a._shared
            assert shared_a is not None
            _, slot = await take(a, model)
            slot.release()
            throwaway_redis.kill()
            # Redis gone: no hang, no error; the local view with this worker's share of the cap (2).
            started = asyncio.get_running_loop().time()
            slots = [(await take(a, model))[1] for _ in range(3)]
            assert [s.channel.name for s in slots] == ["only", "only", "other"]
            assert asyncio.get_running_loop().time() - started < 1.5
            assert not shared_a.up
            assert by_name(await a.report(), "a/model")["only"]["shared"] is False
            for s in slots:
                s.release()
            # Failures are counted locally meanwhile, by the same rules.
            for _ in range(3):
                await tried(a, model, {"only"})
            assert by_name(a.health(), "a/model")["only"]["state"] == "cooling_down"
            # Redis back: shared again, without a restart.
            throwaway_redis.start()
            await wait_for_port(port)
            for _ in range(50):
                if shared_a.up:
                    break
                await asyncio.sleep(0.05)
            assert shared_a.up
            # The local cool-down stays local; the cap is one count again (4 across both).
            slots = [(await take(r, model, {"nothing"}))[1] for r in (b, b, b, b)]
            assert [s.channel.name for s in slots] == ["only"] * 4
            assert (await b.report())["a/model"][0]["in_flight"] == 4
            for s in slots:
                s.release()

    with caplog.at_level(logging.WARNING, logger="gateway.routing"):
        asyncio.run(go())
    unreachable = [r for r in caplog.records if "unreachable" in r.getMessage()]
    assert len(unreachable) == 1  # once, not once per request (b made no call meanwhile)


def test_a_pinned_request_passes_a_busy_mark_made_on_another_process(redis_url: str) -> None:
    """Routing review: a Responses turn whose state lives on a channel marked busy (an upstream
    429 seen by another process) got the gateway's own 429 without asking the upstream."""
    model = ModelConfig("a/model", "chat", (channel("a"), channel("b", priority=1)))

    async def overloaded(ch: ChannelConfig) -> str:
        raise GatewayError("provider_overloaded", "busy", headers={"retry-after": "15"}, retry="other")

    async def go() -> None:
        async with processes(redis_url, model) as (one, two):
            with pytest.raises(GatewayError):
                await one.run(model, overloaded, [], model.channels[1])
            await until_shown(two, "b", "state", "busy")
            calls: list[str] = []
            _, slot = await two.run(model, answering(set(), calls), [], model.channels[1])
            slot.release()
            assert calls == ["b"]

    asyncio.run(go())

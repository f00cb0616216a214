"""Two gateways on one Redis share their channels' caps and cool-downs (gateway.shared_channels):
whole processes, the simulator upstream, a Redis key prefix of each test's own ([redis] prefix)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.shared_channels import LEASE_SECONDS, RENEW_SECONDS
from harness import Gateway, free_port, gateway, process_tree

TOKEN_ENV = "GATEWAY_TEST_ADMIN_TOKEN"
TOKEN = "admin-" + "0123456789abcdef" * 3
CHAT = "/v1/chat/completions"
ROUTING = "retry_backoff_seconds = 0.01\nfailures_to_cool_down = 3\ncooldown_seconds = 30"


def models(sim_url: str, dead_url: str) -> str:
    sim = sim_url + "/v1"
    return f"""
[[models]]
name = "test/capped"
type = "chat"
[models.prices]
input = "2.50"
output = "10.00"
[[models.channels]]
name = "only"
provider = "openai"
base_url = "{sim}"
model = "gpt-4o-mini"
max_concurrency = 2

[[models]]
name = "test/cooldown"
type = "chat"
[models.prices]
input = "2.50"
output = "10.00"
[[models.channels]]
name = "dead"
provider = "openai"
base_url = "{dead_url}"
model = "gpt-4o-mini"
priority = 0
[[models.channels]]
name = "good"
provider = "openai"
base_url = "{sim}"
model = "gpt-4o-mini"
priority = 1

[admin]
token_env = "{TOKEN_ENV}"
"""


@contextmanager
def gateways(tmp: Path, sim_url: str, redis_url: str, count: int = 2) -> Iterator[list[Gateway]]:
    """`count` gateways of one worker each on one Redis, with a key prefix of their own."""
    prefix = "test-" + uuid.uuid4().hex
    dead = f"http://127.0.0.1:{free_port()}/v1"
    redis = f'\n[redis]\nurl = "{redis_url}"\nprefix = "{prefix}"\n'
    for i in range(count):
        (tmp / f"gw{i}").mkdir()
    with ExitStack() as stack:
        yield [
            stack.enter_context(
                gateway(
                    tmp / f"gw{i}",
                    models(sim_url, dead),
                    server_toml="workers = 1" + redis,
                    env={TOKEN_ENV: TOKEN},
                    routing_toml=ROUTING,
                )
            )
            for i in range(count)
        ]


def chat(model: str, directives: str = "") -> dict[str, Any]:
    return {
        "model": model,
        "max_tokens": 3,
        "messages": [{"role": "user", "content": f"{uuid.uuid4().hex} [sim tokens=3 {directives}]"}],
    }


def channels(gw: Gateway, model: str) -> dict[str, dict[str, Any]]:
    with gw.admin(TOKEN) as admin:
        r = admin.get("/channels")
    assert r.status_code == 200, r.text
    [entry] = [m for m in r.json()["data"] if m["model"] == model]
    return {c["name"]: c for c in entry["channels"]}


def post(gw: Gateway, key: str, body: dict[str, Any]) -> int:
    with gw.client(key) as c:
        return c.post(CHAT, json=body).status_code


def test_a_cap_holds_across_instances(tmp_path: Path, sim_url: str, redis_url: str) -> None:
    with gateways(tmp_path, sim_url, redis_url) as (a, b):
        keys = {id(a): a.new_key().key, id(b): b.new_key().key}
        slow = chat("test/capped", "ttft=2s")
        with ThreadPoolExecutor(6) as pool:
            # Six slow requests, three on each instance; each alone would take 2 of them.
            running = [pool.submit(post, g, keys[id(g)], slow) for g in (a, b, a, b, a, b)]
            deadline = time.monotonic() + 5
            while channels(b, "test/capped")["only"]["in_flight"] < 2:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            for g in (a, b):
                shown = channels(g, "test/capped")["only"]
                assert (shown["in_flight"], shown["max_concurrency"], shown["state"], shown["shared"]) == (
                    2,
                    2,
                    "at_capacity",
                    True,
                )
            statuses = sorted(f.result() for f in running)
        assert statuses == [200, 200, 429, 429, 429, 429]
        assert channels(a, "test/capped")["only"]["in_flight"] == 0
        assert post(b, keys[id(b)], chat("test/capped")) == 200


def test_a_channel_cooled_down_on_one_instance_is_cooled_on_the_other(
    tmp_path: Path, sim_url: str, redis_url: str
) -> None:
    with gateways(tmp_path, sim_url, redis_url) as (a, b):
        key_a, key_b = a.new_key(), b.new_key()
        for _ in range(3):  # the dead channel fails three times in a row on a: cooled down
            assert post(a, key_a.key, chat("test/cooldown")) == 200
        shown = channels(b, "test/cooldown")["dead"]
        assert shown["state"] == "cooling_down" and shown["failures_in_a_row"] == 3
        assert post(b, key_b.key, chat("test/cooldown")) == 200
        with b.admin(TOKEN) as admin:
            [entry] = admin.get("/logs", params={"key_id": key_b.key_id}).json()["data"]
        assert [t["channel"] for t in entry["attempts"]] == ["good"]  # b never tried the dead one


def test_a_killed_instance_slots_come_back_within_the_lease(
    tmp_path: Path, sim_url: str, redis_url: str
) -> None:
    with gateways(tmp_path, sim_url, redis_url) as (a, b):
        key_a, key_b = a.new_key().key, b.new_key().key
        with ThreadPoolExecutor(2) as pool:
            held = [pool.submit(post, a, key_a, chat("test/capped", "ttft=60s")) for _ in range(2)]
            deadline = time.monotonic() + 5
            while channels(b, "test/capped")["only"]["in_flight"] < 2:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            # kill -9, the worker with the slots first: killed after its supervisor, it had notice
            # (SIGTERM on its parent's death, gateway.drain) and could give the slots back at once.
            for pid in reversed(process_tree(a.proc.pid)):
                os.kill(pid, signal.SIGKILL)
            killed = time.monotonic()
            assert post(b, key_b, chat("test/capped")) == 429  # still held by the dead process
            while post(b, key_b, chat("test/capped")) != 200:
                assert time.monotonic() - killed < LEASE_SECONDS + 2, "the slots never came back"
                time.sleep(0.25)
            assert (
                time.monotonic() - killed > LEASE_SECONDS - RENEW_SECONDS - 1
            )  # not before the leases ran out
            for f in held:
                with pytest.raises(httpx.HTTPError):
                    f.result()


def test_without_redis_a_gateway_routes_on_its_own_view_and_comes_back(tmp_path: Path, sim_url: str) -> None:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed")
    port = free_port()  # a private Redis, started and killed here (never the shared one)
    args = [binary, "--port", str(port), "--save", "", "--appendonly", "no", "--bind", "127.0.0.1"]
    servers = [subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        with gateways(tmp_path, sim_url, f"redis://127.0.0.1:{port}/0", count=1) as (g,):
            key = g.new_key().key
            assert post(g, key, chat("test/capped")) == 200
            assert channels(g, "test/capped")["only"]["shared"] is True
            servers[0].kill()
            servers[0].wait()
            started = time.monotonic()
            assert [post(g, key, chat("test/capped")) for _ in range(3)] == [200, 200, 200]
            assert time.monotonic() - started < 3  # no hang
            shown = channels(g, "test/capped")["only"]
            assert (shown["shared"], shown["in_flight"], shown["max_concurrency"]) == (False, 0, 2)
            servers.append(subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            deadline = time.monotonic() + 10
            while not channels(g, "test/capped")["only"]["shared"]:
                assert time.monotonic() < deadline, "never went back to the shared state"
                post(g, key, chat("test/capped"))
                time.sleep(0.2)
            assert post(g, key, chat("test/capped")) == 200
    finally:
        for server in servers:
            if server.poll() is None:
                server.kill()
                server.wait()

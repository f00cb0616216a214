"""`gateway demo` (what `make run` starts): the base URL, then the demo key, then an admin token with
which the management API answers, as the README and docs/admin.md use them; then the console's
address and a demo member's sign-in, with a password new on every run."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness import free_port, wait_until_listening

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def running_demo(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], list[str], int, int]]:
    """The demo on free ports with its own store: its process, its printed lines, its port and its
    simulator's port."""
    config = tmp_path / "demo.toml"
    config.write_text(
        (ROOT / "config" / "demo.toml").read_text().replace('"../var/demo.db"', f'"{tmp_path}/demo.db"')
    )
    port, sim_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k != "GATEWAY_ADMIN_TOKEN"}
    # A session of its own, so that Ctrl-C (SIGINT to the group) stops the demo, its simulator and
    # its gateway as it would in a terminal.
    command = ["demo", "--config", str(config), "--port", str(port), "--sim-port", str(sim_port)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline().rstrip("\n") for _ in range(9)]
        wait_until_listening(port, proc)
        yield proc, lines, port, sim_port
    finally:
        with contextlib.suppress(ProcessLookupError):  # the group is gone already
            os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[tuple[list[str], int]]:
    with running_demo(tmp_path) as (_, lines, port, _):
        yield lines, port


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


def test_sigterm_to_the_demo_alone_stops_its_gateway_and_its_simulator(tmp_path: Path) -> None:
    with running_demo(tmp_path) as (proc, _, port, sim_port):
        proc.send_signal(signal.SIGTERM)  # not to its group: a supervisor or `kill` would do this
        assert proc.wait(30) == 0
        deadline = time.monotonic() + 10
        while not (_refused(port) and _refused(sim_port)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _refused(port) and _refused(sim_port)


def test_demo_prints_url_key_and_an_admin_token_that_works(demo: tuple[list[str], int]) -> None:
    lines, port = demo
    base, key = lines[2], lines[4]
    assert base == f"http://127.0.0.1:{port}" and key.startswith("sk-")  # the lines as they were
    name, _, token = lines[6].partition("=")
    assert name == "GATEWAY_ADMIN_TOKEN" and len(token) >= 32 and not token.startswith("sk-")
    admin = {"authorization": f"Bearer {token}"}
    deadline = time.monotonic() + 10
    while (r := httpx.get(f"{base}/admin/v1/accounts", headers=admin)).status_code != 200:
        assert time.monotonic() < deadline, r.text
        time.sleep(0.1)
    assert "demo" in [a["name"] for a in r.json()["data"]]
    # OpenAI's model, and those whose channels must sign in: Azure's (the demo's placeholder key),
    # Bedrock's (the simulator's AWS key pair), Gemini's, Vertex's (the demo's service account).
    for model in (
        "openai/gpt-4o-mini",
        "azure/gpt-4o-mini",
        "bedrock/claude-3-haiku",
        "vertex/claude-sonnet-4-5",
        "google/gemini-2.5-flash",
    ):
        chat = httpx.post(
            f"{base}/v1/chat/completions",
            headers={"authorization": f"Bearer {key}"},
            json={"model": model, "messages": [{"role": "user", "content": "Hello"}]},
            timeout=30,
        )
        assert chat.status_code == 200, chat.text
    wrong = httpx.get(f"{base}/admin/v1/accounts", headers={"authorization": f"Bearer {key}"})
    assert wrong.status_code == 403


def test_demo_prints_the_console_and_a_sign_in_that_works(demo: tuple[list[str], int]) -> None:
    lines, port = demo
    base = f"http://127.0.0.1:{port}"
    assert lines[7] == f"Console: {base}/console/"
    prefix = "Console sign-in: demo@example.com / "
    assert lines[8].startswith(prefix)
    password = lines[8][len(prefix) :]
    assert len(password) >= 12
    with httpx.Client(base_url=base, timeout=30) as browser:
        wrong = browser.post("/console/login", data={"email": "demo@example.com", "password": password + "x"})
        assert wrong.status_code == 401
        r = browser.post("/console/login", data={"email": "demo@example.com", "password": password})
        assert r.status_code == 303, r.text
        accounts = httpx.get(
            f"{base}/admin/v1/accounts", headers={"authorization": f"Bearer {lines[6].partition('=')[2]}"}
        ).json()["data"]
        demo_account = next(a for a in accounts if a["name"] == "demo")
        assert r.headers["location"] == f"/console/a/{demo_account['id']}/"


def test_a_second_run_prints_a_new_password_and_the_first_stops_working(tmp_path: Path) -> None:
    """The member exists from the first run: the second sets a new password, shown only there."""
    from gateway.cli import _demo_member, _run
    from gateway.config import load_settings
    from gateway.console.security import password_matches

    config = tmp_path / "demo.toml"
    config.write_text(
        (ROOT / "config" / "demo.toml").read_text().replace('"../var/demo.db"', f'"{tmp_path}/demo.db"')
    )
    settings = load_settings(config)
    first = _run(_demo_member, settings)
    second = _run(_demo_member, settings)
    assert first != second

    async def hash_of(store: Any) -> str | None:
        user = await store.find_console_user("demo@example.com")
        return None if user is None else user.password_hash

    stored = _run(hash_of, settings)
    assert stored is not None
    assert asyncio.run(password_matches(stored, second))
    assert not asyncio.run(password_matches(stored, first))


def test_a_reload_of_a_demo_on_another_simulator_port_takes_the_file_as_edited(tmp_path: Path) -> None:
    """Docs review: `demo --sim-port` served a copy of the file made at start, so a reload read the
    copy: an edit answered 202 and changed nothing, a change a reload must refuse too."""
    with running_demo(tmp_path) as (_, lines, _, _):
        base, key = lines[2], lines[4]
        admin = {"authorization": f"Bearer {lines[6].partition('=')[2]}"}
        user = {"authorization": f"Bearer {key}"}
        info = f"{base}/model_group/info?model_group=meta/llama-3.1-8b-instruct"

        def price() -> str:
            return str(httpx.get(info, headers=user).json()["data"][0]["input_cost_per_million_tokens"])

        assert price() == "0.05"
        config = tmp_path / "demo.toml"
        text = config.read_text()
        config.write_text(text.replace(f'"{tmp_path}/demo.db"', f'"{tmp_path}/other.db"', 1))
        refused = httpx.post(f"{base}/admin/v1/config/reload", headers=admin)
        assert refused.status_code == 400 and "store.path" in refused.json()["error"]["message"]
        config.write_text(text.replace('input = "0.05"', 'input = "7.77"', 1))
        reloaded = httpx.post(f"{base}/admin/v1/config/reload", headers=admin)
        assert reloaded.status_code == 202 and reloaded.json()["config"] == "demo.toml", reloaded.text
        deadline = time.monotonic() + 30
        while price() != "7.77":
            assert time.monotonic() < deadline
            time.sleep(0.2)
        chat = httpx.post(
            f"{base}/v1/chat/completions",
            headers=user,
            json={"model": "meta/llama-3.1-8b-instruct", "messages": [{"role": "user", "content": "Hi"}]},
            timeout=30,
        )
        assert chat.status_code == 200, chat.text  # the new workers still reach the demo's simulator


def test_the_demo_s_vertex_key_follows_the_simulator_s_port(tmp_path: Path) -> None:
    """Code review: the service account file the demo makes was written once, so a demo on another
    --sim-port asked the first run's port for its tokens."""
    import json

    from gateway.cli import _demo_upstream_keys
    from gateway.config import load_settings

    config = tmp_path / "demo.toml"
    config.write_text(
        (ROOT / "config" / "demo.toml").read_text().replace('"../var/demo.db"', f'"{tmp_path}/demo.db"')
    )
    settings = load_settings(config)
    saved = dict(os.environ)
    try:
        for port in (9931, 9932, 9932):
            _demo_upstream_keys(settings, port)
            key_file = Path(os.environ["GOOGLE_APPLICATION_CREDENTIALS"])
            assert json.loads(key_file.read_text())["token_uri"] == f"http://127.0.0.1:{port}/token"
    finally:
        os.environ.clear()
        os.environ.update(saved)

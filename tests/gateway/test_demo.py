"""`gateway demo` (what `make run` starts): the base URL, then the demo key, then an admin token with
which the management API answers, as the README and docs/admin.md use them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from harness import free_port, wait_until_listening

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[tuple[list[str], int]]:
    """The demo on free ports with its own store: its printed lines and its port."""
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
        lines = [proc.stdout.readline().rstrip("\n") for _ in range(7)]
        wait_until_listening(port, proc)
        yield lines, port
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


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
    chat = httpx.post(
        f"{base}/v1/chat/completions",
        headers={"authorization": f"Bearer {key}"},
        json={"model": "openai/gpt-4o-mini", "messages": [{"role": "user", "content": "Hello"}]},
        timeout=30,
    )
    assert chat.status_code == 200, chat.text
    wrong = httpx.get(f"{base}/admin/v1/accounts", headers={"authorization": f"Bearer {key}"})
    assert wrong.status_code == 403

"""Which gateway listens where (gateway.deployment).

A second `gateway serve` on a port a gateway already serves: the workers listen with SO_REUSEPORT,
so the kernel would split the port's connections between the two. On the same store and Redis that
is a handover and goes ahead; on other data, or beside a process the gateway cannot identify, the
start is refused with one line. A command run beside a gateway names where it listens."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from gateway.config import Settings
from gateway.deployment import RUN_DIR_PREFIX, identity
from gateway.reload import fixed_changes
from harness import chat_model, eventually, free_port, running

pytestmark = pytest.mark.slow


def _config(tmp: Path, name: str, port: int, store: str, sim_url: str) -> Path:
    config = tmp / f"{name}.toml"
    config.write_text(
        f'[server]\nport = {port}\nworkers = 1\n[store]\npath = "{tmp / store}.db"\n'
        + chat_model("test/a", "sim-chat", sim_url)
    )
    return config


def _serve(config: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _ready_status(port: int) -> int:
    return httpx.get(f"http://127.0.0.1:{port}/ready", timeout=5).status_code


def test_a_gateway_on_other_data_is_refused_the_port(tmp_path: Path, sim_url: str) -> None:
    port = free_port()
    first = _config(tmp_path, "first", port, "first", sim_url)
    with running(["serve", "--config", str(first)], port) as proc:
        second = _serve(_config(tmp_path, "second", port, "second", sim_url))
        _, stderr = second.communicate(timeout=60)
        assert second.returncode == 2, stderr
        assert f"server: 127.0.0.1:{port} is already served by another gateway (pid {proc.pid})" in stderr
        assert f"store sqlite:{tmp_path / 'first.db'}" in stderr
        assert f"store sqlite:{tmp_path / 'second.db'}" in stderr
        assert "Traceback" not in stderr
        assert _ready_status(port) == 200  # the first serves on, alone


def test_the_same_deployment_joins_for_a_handover(tmp_path: Path, sim_url: str) -> None:
    port = free_port()
    config = _config(tmp_path, "gateway", port, "shared", sim_url)
    with running(["serve", "--config", str(config)], port) as old:
        new = _serve(config)
        try:
            assert new.stderr is not None
            line = new.stderr.readline()
            while line and "joins it" not in line:  # the supervisor's other records come first
                line = new.stderr.readline()
            # A record of the log's format (JSON off a terminal), as every other line on stderr
            # (operator review: a plain line broke a JSON log shipper's stream).
            record = json.loads(line)
            assert record["level"] == "info", record
            assert (
                f"127.0.0.1:{port} is already served by the gateway with pid {old.pid}" in record["message"]
            )
            assert "this one joins it" in record["message"]
            # The old one goes; the new one serves the port alone (no request is refused meanwhile).
            eventually(lambda: _serving(new.pid), 30, 0.1, what="the new gateway's worker serving")
            old.terminate()
            old.wait(60)
            assert _ready_status(port) == 200
        finally:
            new.terminate()
            new.communicate(timeout=60)


def test_a_foreign_listener_sharing_the_port_is_refused(tmp_path: Path, sim_url: str) -> None:
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        done = _serve(_config(tmp_path, "gateway", port, "gateway", sim_url))
        _, stderr = done.communicate(timeout=60)
    assert done.returncode == 2, stderr
    assert f"server: 127.0.0.1:{port} is already served by a process that shares its port" in stderr


def _serving(pid: int) -> bool:
    """Whether a worker of the gateway whose supervisor is `pid` has started serving (its mark in
    the supervisor's run directory, gateway.drain)."""
    base = Path(tempfile.gettempdir())
    return any(any(d.glob("serving.*")) for d in base.glob(f"{RUN_DIR_PREFIX}{pid}-*"))


def test_a_commands_link_names_where_the_gateway_on_its_store_listens(tmp_path: Path, sim_url: str) -> None:
    """`gateway admin create-console-user` runs beside the gateway: without public_base_url, its
    link names the port a running gateway on the same store was given (--port), not the file's."""
    configured, port = free_port(), free_port()
    config = _config(tmp_path, "gateway", configured, "gateway", sim_url)

    def invite(email: str) -> str:
        command = ["admin", "create-console-user", "--config", str(config), "--email", email]
        made = subprocess.run(
            [sys.executable, "-m", "gateway", *command, "--role", "operator"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert made.returncode == 0, made.stderr
        return made.stdout

    with running(["serve", "--config", str(config), "--port", str(port)], port):
        link = invite("ops@example.com")
    assert link.startswith(f"http://127.0.0.1:{port}/console/invite/"), link
    # No gateway running: the configured address.
    link = invite("ops2@example.com")
    assert link.startswith(f"http://127.0.0.1:{configured}/console/invite/"), link


def test_one_store_spelt_two_ways_is_one_deployment(tmp_path: Path) -> None:
    """How a URL connects (sslmode, application_name, credentials, the default port) and how a
    path is spelt (.., a link) do not make another deployment, for a handover or a reload."""
    pg = Settings(models=(), store_backend="postgres", redis_url="redis://127.0.0.1/0")
    one = replace(pg, store_url="postgresql://gw:secret@db.internal/gateway")
    other = replace(
        pg, store_url="postgresql://gw:other@db.internal:5432/gateway?sslmode=verify-full&application_name=b"
    )
    assert (
        identity(one)
        == identity(other)
        == {
            "store": "postgres:postgresql://db.internal:5432/gateway",
            "redis": "redis://127.0.0.1:6379/0 prefix gateway",
        }
    )
    assert identity(replace(one, store_url="postgresql://db.internal/another")) != identity(one)
    (tmp_path / "data").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "data")
    sqlite = Settings(models=(), store_path=tmp_path / "data" / "a.db")
    for spelt in (tmp_path / "data" / ".." / "data" / "a.db", tmp_path / "link" / "a.db"):
        assert identity(replace(sqlite, store_path=spelt)) == identity(sqlite)
        assert fixed_changes(sqlite, replace(sqlite, store_path=spelt)) == []

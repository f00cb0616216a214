"""`gateway serve`'s run directory (gateway.supervisor: the accepted configuration's copy, the
workers' metrics files) goes when it stops; one left behind by a supervisor killed with SIGKILL is
removed by the next start, and a running gateway's is never touched."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from harness import chat_model, eventually, free_port, running, wait_until_listening

pytestmark = pytest.mark.slow


def _config(tmp: Path, name: str, sim_url: str) -> tuple[Path, int]:
    port = free_port()
    config = tmp / f"{name}.toml"
    config.write_text(
        f'[server]\nport = {port}\nworkers = 1\n[store]\npath = "{tmp / name}.db"\n'
        + chat_model("test/a", "sim-chat", sim_url)
    )
    return config, port


def _run_dirs(tmp: Path) -> set[str]:
    return {p.name for p in tmp.iterdir() if p.name.startswith("gateway-run-")}


def test_a_killed_gateways_run_directory_goes_at_the_next_start(tmp_path: Path, sim_url: str) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp)}
    # Not a supervisor's: an earlier version's name (no process id) and a living process that is
    # not a supervisor (this test) are told apart from a dead one.
    (temp / "gateway-run-olderformat").mkdir()
    (temp / f"gateway-run-{os.getpid()}-notours").mkdir()

    killed_config, killed_port = _config(tmp_path, "killed", sim_url)
    killed = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--config", str(killed_config)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until_listening(killed_port, killed)
        [left] = _run_dirs(temp) - {"gateway-run-olderformat", f"gateway-run-{os.getpid()}-notours"}
        assert left.startswith(f"gateway-run-{killed.pid}-")
        assert (temp / left / "config.toml").exists()
    finally:
        killed.send_signal(signal.SIGKILL)  # no clean-up: its worker ends with it (PDEATHSIG)
        killed.wait()
    eventually(lambda: not _listening(killed_port), 30, 0.1, what="the killed gateway's worker gone")
    assert left in _run_dirs(temp)

    config, port = _config(tmp_path, "next", sim_url)
    with running(["serve", "--config", str(config)], port, env={"TMPDIR": str(temp)}) as proc:
        [own] = [name for name in _run_dirs(temp) if name.startswith(f"gateway-run-{proc.pid}-")]
        # The killed one's is gone, and a pid that is alive but not a supervisor's counts as gone.
        assert _run_dirs(temp) == {own, "gateway-run-olderformat"}

        # A second gateway starting meanwhile leaves the running one's alone.
        other_config, other_port = _config(tmp_path, "other", sim_url)
        with running(["serve", "--config", str(other_config)], other_port, env={"TMPDIR": str(temp)}):
            assert own in _run_dirs(temp)
    # Both stopped cleanly: nothing of theirs is left.
    eventually(
        lambda: _run_dirs(temp) == {"gateway-run-olderformat"}, 15, 0.1, what="the run directories removed"
    )


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0

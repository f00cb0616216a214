"""`gateway serve`'s run directory (gateway.supervisor: the accepted configuration's copy, the
workers' metrics files) goes when it stops; one left behind by a supervisor killed with SIGKILL is
removed by the next start, and a running gateway's is never touched."""

from __future__ import annotations

import fcntl
import os
import signal
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
    # Kept: an earlier version's (no lock file) and one whose lock a living process holds.
    (temp / "gateway-run-olderformat").mkdir()
    held = temp / "gateway-run-1-held"
    held.mkdir()
    holder = os.open(held / "lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)
    kept = {"gateway-run-olderformat", held.name}

    killed_config, killed_port = _config(tmp_path, "killed", sim_url)
    killed = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--config", str(killed_config)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until_listening(killed_port, killed)
        [left] = _run_dirs(temp) - kept
        assert left.startswith(f"gateway-run-{killed.pid}-")
        assert (temp / left / "config.toml").exists()
    finally:
        killed.send_signal(signal.SIGKILL)  # no clean-up: its worker ends with it (PDEATHSIG)
        killed.wait()
    # Its worker ends with it (PDEATHSIG), and the lock they shared with it.
    eventually(lambda: _lock_free(temp / left), 30, 0.1, what="the killed gateway's worker gone")
    assert left in _run_dirs(temp)

    config, port = _config(tmp_path, "next", sim_url)
    output = tmp_path / "next.log"
    with running(["serve", "--config", str(config)], port, env={"TMPDIR": str(temp)}, output=output) as proc:
        [own] = [name for name in _run_dirs(temp) if name.startswith(f"gateway-run-{proc.pid}-")]
        assert _run_dirs(temp) == {own, *kept}  # the killed one's is gone
        assert "removed 1 run directories of gateways that were killed" in output.read_text()

        # A second gateway starting meanwhile leaves the running one's alone.
        other_config, other_port = _config(tmp_path, "other", sim_url)
        with running(["serve", "--config", str(other_config)], other_port, env={"TMPDIR": str(temp)}):
            assert own in _run_dirs(temp)
    # Both stopped cleanly: nothing of theirs is left.
    eventually(lambda: _run_dirs(temp) == kept, 15, 0.1, what="the run directories removed")
    os.close(holder)


def _lock_free(run_dir: Path) -> bool:
    fd = os.open(run_dir / "lock", os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)

"""Workers of `gateway serve` that die (gateway.supervisor): each is started again, after a
growing pause when it keeps dying soon after its start, while the others serve on; the gateway ends
only when workers fail to start at all (exit status 1)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.config import CONFIG_ENV, LISTEN_ENV, WORKERS_ENV, load_settings
from harness import (
    chat_model,
    eventually,
    free_port,
    kill_worker,
    new_key,
    running,
    wait_until_listening,
    workers_serving,
)

pytestmark = pytest.mark.slow


def _config(tmp: Path, port: int, workers: int, sim_url: str) -> Path:
    config = tmp / "gateway.toml"
    config.write_text(
        f'[server]\nport = {port}\nworkers = {workers}\n[store]\npath = "{tmp / "gw.db"}"\n'
        + chat_model("test/a", "sim-chat", sim_url)
        + chat_model("test/tts", "tts-1", sim_url, type_="speech")
    )
    return config


def _chat(url: str, key: str) -> int:
    return httpx.post(
        url + "/v1/chat/completions",
        json={"model": "test/a", "messages": [{"role": "user", "content": "hi"}]},
        headers={"authorization": f"Bearer {key}"},
        timeout=30,
    ).status_code


@dataclass
class Serving:
    proc: subprocess.Popen[bytes]
    url: str
    key: str
    log: Path  # the gateway's output (workers_serving, kill_worker read it)


@contextmanager
def _serving(tmp: Path, sim_url: str, workers: int) -> Iterator[Serving]:
    """`gateway serve` with `workers` workers, once every one serves, and a key with $10."""
    port = free_port()
    config = _config(tmp, port, workers, sim_url)
    key = new_key(load_settings(config), Decimal(10))
    log = tmp / "serve.log"
    with running(["serve", "--config", str(config)], port, output=log) as proc:
        eventually(lambda: len(workers_serving(log)) == workers, 30, 0.1, what="every worker serving")
        yield Serving(proc, f"http://127.0.0.1:{port}", key.key, log)


def test_a_worker_killed_again_and_again_is_restarted_while_the_other_serves(
    tmp_path: Path, sim_url: str
) -> None:
    """Granian alone would end the whole gateway at the second quick death; here each death costs
    only that worker, brought back after a pause that doubles (1 s, 2 s), and worker-2 answers
    every request meanwhile."""
    with _serving(tmp_path, sim_url, 2) as gw:
        refused: list[str] = []
        stop = threading.Event()

        def traffic() -> None:  # new connections, as a load balancer's: never onto a dead worker
            while not stop.is_set():
                try:
                    if _chat(gw.url, gw.key) != 200:
                        refused.append("status")
                except httpx.ConnectError as exc:
                    refused.append(repr(exc))
                except httpx.HTTPError:
                    pass  # a request the killed worker had accepted: lost with it, as with any crash
                time.sleep(0.02)

        thread = threading.Thread(target=traffic)
        thread.start()
        try:
            for _ in range(3):
                kill_worker(gw.log, 1)
        finally:
            stop.set()
            thread.join(30)
        output = gw.log.read_text()
        assert "starting it again in 1 s" in output and "starting it again in 2 s" in output
        assert gw.proc.poll() is None
        assert refused == []
        assert all(_chat(gw.url, gw.key) == 200 for _ in range(8))


def test_a_single_worker_that_had_served_is_started_again_after_quick_deaths(
    tmp_path: Path, sim_url: str
) -> None:
    with _serving(tmp_path, sim_url, 1) as gw:
        for _ in range(2):
            assert _chat(gw.url, gw.key) == 200
            kill_worker(gw.log, 1)
        assert gw.proc.poll() is None
        assert _chat(gw.url, gw.key) == 200


def test_workers_that_cannot_start_end_the_gateway(tmp_path: Path, sim_url: str) -> None:
    """The database out of reach when the workers start: each worker's start-up fails, twice, and
    the supervisor ends with status 1, the reason in its log, rather than retrying for ever.
    (`gateway serve` checks the database once before it becomes the supervisor, so this starts the
    supervisor as serve does, to reach the workers' own failure: a database gone between the two.)"""
    port = free_port()
    config = tmp_path / "gateway.toml"
    config.write_text(
        f'[server]\nport = {port}\nworkers = 2\n[store]\nbackend = "postgres"\nurl_env = "T_PG"\n'
        '[redis]\nurl = "redis://127.0.0.1:6379/0"\n' + chat_model("test/a", "sim-chat", sim_url)
    )
    env = {**os.environ, "T_PG": f"postgresql://postgres@127.0.0.1:{free_port()}/none"}
    options = {"host": "127.0.0.1", "port": port, "workers": 2, "drain_seconds": 30.0}
    done = subprocess.run(
        [sys.executable, "-m", "gateway.supervisor", json.dumps(options)],
        env={**env, CONFIG_ENV: str(config), WORKERS_ENV: "2", LISTEN_ENV: f"127.0.0.1:{port}"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "PostgreSQL is out of reach" in done.stdout + done.stderr
    assert "no worker serves: exiting" in done.stdout + done.stderr
    # `gateway serve` itself says so in one line before any worker starts.
    served = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--config", str(config)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert served.returncode == 1 and served.stderr.count("\n") == 1, served.stderr
    assert served.stderr.startswith("gateway: the store (PostgreSQL at postgresql://127.0.0.1:")


def test_a_stop_signalled_to_the_whole_group_is_a_clean_stop(tmp_path: Path, sim_url: str) -> None:
    """Ctrl-C, or a service manager that signals every process of the group: the workers end on
    their own signal, which is no crash. `gateway serve` exits 0 and logs no error (Granian alone
    logs 'Unexpected exit' for each and exits 1)."""
    port = free_port()
    config = _config(tmp_path, port, 2, sim_url)
    with (tmp_path / "serve.log").open("w+b") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--config", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a process group of its own, as under a terminal or a service
        )
        try:
            wait_until_listening(port, proc)
            eventually(
                lambda: len(workers_serving(tmp_path / "serve.log")) == 2, 30, 0.1, what="both workers"
            )
            os.killpg(proc.pid, signal.SIGTERM)
            assert proc.wait(30) == 0
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.seek(0)
        output = log.read().decode(errors="replace")
    assert "Unexpected exit" not in output and '"level":"error"' not in output, output


def test_workers_stop_when_their_supervisor_is_killed(tmp_path: Path, sim_url: str) -> None:
    """kill -9 of `gateway serve` itself: its workers drain and stop (they would otherwise serve on
    as orphans, on the port the next `gateway serve` takes as well), and the next start on the same
    store serves, with nothing of theirs left held."""
    with _serving(tmp_path, sim_url, 2) as gw:
        assert _chat(gw.url, gw.key) == 200
        workers = [int(p) for p in re.findall(r"Spawning worker-\d with PID: (\d+)", gw.log.read_text())]
        gw.proc.kill()
        gw.proc.wait()
        # At once, as a rule; at the latest when their own bound runs out (drain_seconds 30 + 10 + 1).
        eventually(lambda: not any(_alive(pid) for pid in workers), 50, 0.1, what="the orphaned workers gone")
    with _serving(tmp_path, sim_url, 2) as again:
        assert _chat(again.url, again.key) == 200


def test_a_worker_whose_supervisor_is_already_gone_does_not_start() -> None:
    """A worker forked just before its supervisor was killed: its SIGTERM handler is still the
    supervisor's (it came with the fork and would swallow the signal), so end_with_supervisor
    restores the default first, and the worker ends instead of serving on as an orphan."""
    code = (
        "import os, signal\n"
        "signal.signal(signal.SIGTERM, lambda *_: None)  # the supervisor's, inherited\n"
        "os.environ['GATEWAY_SUPERVISOR_PID'] = '1'  # not this process's parent: gone\n"
        "from gateway.drain import end_with_supervisor\n"
        "end_with_supervisor()\n"
        "print('serving')\n"
    )
    done = _python(code)
    assert done.returncode == -signal.SIGTERM and "serving" not in done.stdout, done


def test_a_stopping_worker_is_ended_by_the_kernel_past_its_bound() -> None:
    """The stop signal sets the kernel's alarm at drain_seconds + KILL_GRACE_SECONDS + 1: a worker
    stuck where no Python runs (or with no supervisor to kill it) still ends then."""
    code = (
        "import asyncio, os, signal\n"
        "from gateway.drain import Drain\n"
        "signal.signal(signal.SIGTERM, lambda *_: None)  # what Granian's worker would do instead\n"
        "async def main():\n"
        "    Drain(1.0).install()\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    await asyncio.sleep(0.1)\n"
        "    print(signal.alarm(0))\n"
        "asyncio.run(main())\n"
    )
    done = _python(code)
    assert done.returncode == 0, done
    assert int(done.stdout) in (11, 12), done  # ceil(1 + 10) + 1, a moment later


def _python(code: str) -> subprocess.CompletedProcess[str]:
    """`code` run by a fresh interpreter, as a worker process would start."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=False
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (ended, not yet reaped by init) has stopped too
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_an_answer_charged_just_before_its_worker_was_killed_is_replayed_not_charged_again(
    tmp_path: Path, sim_url: str
) -> None:
    """The request was charged and answered, but its worker died before the store had applied
    either (review: the answer for its Idempotency-Key was kept in a later step, so the key was
    freed with the dead worker's claims and the retry ran, and was charged, again). The answer is
    journaled with its charge: the retry gets it replayed, and the key was charged once."""
    with _serving(tmp_path, sim_url, 1) as gw:
        body = {"model": "test/tts", "voice": "alloy", "input": "hi [sim ttft=1500ms]"}
        headers = {"authorization": f"Bearer {gw.key}", "idempotency-key": "charged-once"}
        url = gw.url + "/v1/audio/speech"
        answers: list[httpx.Response] = []
        thread = threading.Thread(
            target=lambda: answers.append(httpx.post(url, json=body, headers=headers, timeout=30))
        )
        thread.start()
        time.sleep(0.7)  # the key is claimed; the model has not answered yet
        # The store's writer is held up (a slow disk, a long write elsewhere) as the answer comes.
        blocker = sqlite3.connect(tmp_path / "gw.db", isolation_level=None, timeout=30)

        def unblock() -> None:
            if blocker.in_transaction:
                blocker.execute("ROLLBACK")

        try:
            blocker.execute("BEGIN IMMEDIATE")
            thread.join(30)
            assert answers and answers[0].status_code == 200, answers  # journaled: no wait on the store
            first = answers[0]
            # Killed before its writer could apply anything; its replacement replays its journal.
            kill_worker(gw.log, 1, then=unblock)
        finally:
            unblock()
            blocker.close()
        retried = httpx.post(url, json=body, headers=headers, timeout=30)
        assert retried.status_code == 200, retried.text
        assert retried.headers.get("idempotency-replayed") == "true"
        assert retried.content == first.content and retried.headers["x-service-cost"] == "0"
    with sqlite3.connect(tmp_path / "gw.db") as db:
        charged = [
            Decimal(c) for (c,) in db.execute("SELECT cost FROM usage_records WHERE model = 'test/tts'")
        ]
    assert charged == [Decimal(first.headers["x-service-cost"])]


def test_an_idempotency_key_held_by_a_killed_worker_is_free_once_it_is_replaced(
    tmp_path: Path, sim_url: str
) -> None:
    """The request holding the key died with its worker: the replacement's start (which replays
    the dead worker's journal) frees the key, so the client's retry runs instead of hearing
    "still running" until the lease's five minutes end (review)."""
    with _serving(tmp_path, sim_url, 1) as gw:
        body = {"model": "test/tts", "voice": "alloy", "input": "hi [sim ttft=4s]"}
        headers = {"authorization": f"Bearer {gw.key}", "idempotency-key": "retry-me"}
        url = gw.url + "/v1/audio/speech"  # an endpoint that honours Idempotency-Key

        def first() -> None:
            with contextlib.suppress(httpx.HTTPError):  # its worker is killed under it
                httpx.post(url, json=body, headers=headers, timeout=30)

        thread = threading.Thread(target=first)
        thread.start()
        time.sleep(1)  # the first request holds the key, waiting for its model
        held = httpx.post(url, json=body, headers=headers, timeout=30)
        assert held.status_code == 409 and held.json()["error"]["code"] == "idempotency_key_in_progress"
        kill_worker(gw.log, 1)
        thread.join(30)
        retried = httpx.post(url, json=body, headers=headers, timeout=30)
        assert retried.status_code == 200, retried.text
        assert "idempotency-replayed" not in retried.headers


# The stop's handling of workers (GatewayGranian._stop_workers), run in a process of its own: the
# supervisor's module makes its run directory as it is imported. Each worker is the surface of
# Granian's WorkerProcess a stop uses; `reaped` has another thread reap the process as it ends, as
# Granian's watcher thread does (multiprocessing's join and is_alive then see ECHILD, not an exit).
_STOP_SCRIPT = """
import json, multiprocessing, os, signal, sys, time
from gateway.supervisor import GatewayGranian

IGNORE_TERM = sys.argv[1] == "ignore-term"

def serve(ready):
    signal.signal(signal.SIGTERM, signal.SIG_IGN if IGNORE_TERM else (lambda *_: os._exit(0)))
    ready.set()
    time.sleep(60)

class Worker:
    def __init__(self, idx):
        self.idx = idx
        self.killed = False
        context = multiprocessing.get_context("fork")
        ready = context.Event()
        self.inner = context.Process(target=serve, args=(ready,))
        self.inner.start()
        ready.wait(30)
    def terminate(self):
        self.inner.terminate()
        if not IGNORE_TERM:
            os.waitpid(self.inner.pid, 0)  # the watcher thread wins the race for the reaping
    def kill(self):
        self.killed = True
        self.inner.kill()
    def join(self, timeout=None):
        self.inner.join(timeout)
    def is_alive(self):
        return self.inner.is_alive()
    def _id(self):
        return self.inner.pid

server = GatewayGranian.__new__(GatewayGranian)
server.wrks = [Worker(0), Worker(1)]
server.notice_seconds = 0
server.workers_kill_timeout = 1
started = time.monotonic()
server._stop_workers()
print(json.dumps({
    "killed": [w.killed for w in server.wrks],
    "seconds": time.monotonic() - started,
    "exits": [w.inner.join(5) or w.inner.exitcode for w in server.wrks] if IGNORE_TERM else None,
}))
"""


def _stop(mode: str) -> tuple[dict[str, Any], str]:
    done = subprocess.run(
        [sys.executable, "-c", _STOP_SCRIPT, mode], capture_output=True, text=True, timeout=60, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def test_a_worker_that_ended_is_not_killed_when_another_thread_reaped_it() -> None:
    """Review: a stop with a stream running logged "Killing worker-1 after it refused to gracefully
    stop" 16 ms after the worker had drained and ended, and sent SIGKILL to its pid: Granian's join
    had lost the reaping to the worker's watcher thread and took ECHILD for a live worker. The stop
    reads each worker's end on its sentinel."""
    result, log = _stop("end-on-term")
    assert result["killed"] == [False, False], log
    assert "refused" not in log and "outlived" not in log, log
    assert result["seconds"] < 1, result


def test_a_worker_that_ignores_its_sigterm_is_killed_at_the_timeout() -> None:
    result, log = _stop("ignore-term")
    assert result["killed"] == [True, True], log
    assert result["exits"] == [-signal.SIGKILL, -signal.SIGKILL], result
    assert "killing worker-1: it outlived its drain" in log, log
    assert 1 <= result["seconds"] < 5, result

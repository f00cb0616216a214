"""Granian's runtime threads run at SCHED_BATCH in every worker (gateway.runtime_threads): they wait
for the core instead of taking it from the event loop; every other thread keeps the default."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest

from gateway import runtime_threads
from gateway.runtime_threads import RUNTIME_THREAD_PREFIX, batch_runtime_threads
from harness import Gateway, KeyHandle, eventually, process_tree

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="scheduling policies are Linux's")
BATCH = os.SCHED_BATCH | os.SCHED_RESET_ON_FORK


def _threads(pid: int) -> dict[int, tuple[str, int]]:
    """Each thread of `pid`: its name and its scheduling policy (flags included)."""
    found = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            tid = int(task.name)
            found[tid] = ((task / "comm").read_text().strip(), os.sched_getscheduler(tid))
        except OSError:  # ended meanwhile
            continue
    return found


def test_a_worker_runtime_threads_are_batch_and_no_other(gw: Gateway, key: KeyHandle) -> None:
    with gw.client(key.key) as client:  # the worker has served: its runtime is up
        assert client.get("/v1/models").status_code == 200

    def worker() -> dict[int, tuple[str, int]] | None:
        for pid in process_tree(gw.proc.pid):
            threads = _threads(pid)
            runtime = [policy for name, policy in threads.values() if name.startswith(RUNTIME_THREAD_PREFIX)]
            if runtime and all(policy == BATCH for policy in runtime):
                return threads
        return None

    threads = eventually(worker, what="a worker whose runtime threads are at SCHED_BATCH")
    others = {name: policy for name, policy in threads.values() if not name.startswith(RUNTIME_THREAD_PREFIX)}
    assert others and set(others.values()) == {os.SCHED_OTHER}, others


def test_only_runtime_threads_are_set_and_gone_ones_are_skipped(tmp_path: Path) -> None:
    """A fake task list naming this test's own thread as a runtime thread, another thread under
    another name, and a thread that no longer exists."""
    me = threading.get_native_id()
    for tid, name in ((me, "tokio-rt-worker"), (os.getpid() if me != os.getpid() else 1, "python")):
        (tmp_path / str(tid)).mkdir()
        (tmp_path / str(tid) / "comm").write_text(name + "\n")
    (tmp_path / "999999999").mkdir()
    (tmp_path / "999999999" / "comm").write_text("tokio-rt-worker\n")
    try:
        assert batch_runtime_threads(tmp_path) == 1
        assert os.sched_getscheduler(me) == BATCH
    finally:
        os.sched_setscheduler(me, os.SCHED_OTHER, os.sched_param(0))
    assert batch_runtime_threads(tmp_path / "missing") == 0


def test_hand_over_now_yields_only_once_batched(monkeypatch: pytest.MonkeyPatch) -> None:
    yielded: list[None] = []
    monkeypatch.setattr(os, "sched_yield", lambda: yielded.append(None))
    monkeypatch.setattr(runtime_threads, "_batched", False)
    runtime_threads.hand_over_now()
    assert yielded == []
    monkeypatch.setattr(runtime_threads, "_batched", True)
    runtime_threads.hand_over_now()
    assert yielded == [None]

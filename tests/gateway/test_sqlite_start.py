"""Several processes starting on one new SQLite database at the same moment (the workers of
`gateway serve` on its first start) all start: none is refused with "database is locked"; and each
connection is set up as the store's writes and reads expect."""

from __future__ import annotations

import asyncio
import multiprocessing
from multiprocessing.synchronize import Barrier
from pathlib import Path

from gateway.store.sqlite import SqliteStore

PROCESSES = 3
TRIALS = 8  # each on a new file; without the retry, about 6 in 10 had a process refused


def _start(path: Path, together: Barrier, results: multiprocessing.Queue[str]) -> None:
    async def go() -> None:
        store = SqliteStore(path)
        together.wait()
        await store.start()
        await store.close()

    try:
        asyncio.run(go())
        results.put("started")
    except Exception as exc:
        results.put(repr(exc))


def test_workers_starting_together_on_a_new_database_all_start(tmp_path: Path) -> None:
    forked = multiprocessing.get_context("fork")
    for trial in range(TRIALS):
        path = tmp_path / f"trial-{trial}" / "gateway.db"
        together, results = forked.Barrier(PROCESSES), forked.Queue()
        processes = [forked.Process(target=_start, args=(path, together, results)) for _ in range(PROCESSES)]
        for p in processes:
            p.start()
        for p in processes:
            p.join(60)
        assert [results.get(timeout=5) for _ in processes] == ["started"] * PROCESSES, f"trial {trial}"


def test_connections_keep_the_sub_journals_of_savepoints_in_memory(tmp_path: Path) -> None:
    """The writer's savepoints spill their sub-journal past 64 KiB to a temporary file by default:
    a pwrite(2) a page on every group commit (more system calls than the WAL's own)."""
    store = SqliteStore(tmp_path / "gateway.db")
    conn = store._connect(check_same_thread=True)
    try:
        assert conn.execute("PRAGMA temp_store").fetchone() == (2,)  # MEMORY
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert conn.execute("PRAGMA synchronous").fetchone() == (1,)  # NORMAL
    finally:
        conn.close()

"""The embedded store's key cache across processes: a change to a key made by one process reaches
every other one's next lookup (the generation counter, mapped shared), concurrent changes from many
processes all count, and a worker of an earlier version, which only appends to the generation file,
still invalidates within a second."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import sqlite3
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_store_contract import started

from gateway.store.sqlite import SqliteStore, key_cache
from gateway.store.sqlite.key_cache import KeyCache

CHANGES_PER_PROCESS = 200


def _generation_file(db: Path) -> Path:
    return db.parent / (db.name + ".generation")


def test_a_change_in_one_process_reaches_the_next_lookup_of_another(tmp_path: Path) -> None:
    db = tmp_path / "gateway.db"

    async def main() -> None:
        async with started(lambda: SqliteStore(db), 2) as [here, there]:
            account = await here.create_account("acct", Decimal(1))
            secret = os.urandom(32)
            key = await here.create_key(account.id, "k", secret, "sk-a", None)
            cached = await there.find_key(secret)
            assert cached is not None and cached.account.rpm_limit is None
            await here.update_account(account.id, {"rpm_limit": 7})
            found = await there.find_key(secret)
            assert found is not None and found.account.rpm_limit == 7
            assert await here.delete_key(key.id)
            assert await there.find_key(secret) is None

    asyncio.run(main())


def _change_many(path: Path) -> None:
    cache = KeyCache(path)
    cache.open()
    try:
        for _ in range(CHANGES_PER_PROCESS):
            cache.changed()
    finally:
        cache.close()


def test_changes_made_at_once_by_many_processes_all_count(tmp_path: Path) -> None:
    path = tmp_path / "gateway.db.generation"
    reader = KeyCache(path)
    reader.open()
    try:
        before = reader.generation()
        fork = multiprocessing.get_context("fork")
        workers = [fork.Process(target=_change_many, args=(path,)) for _ in range(4)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(60)
            assert worker.exitcode == 0
        # Not one increment lost to another process's (the lock); the length moved as many times.
        counter = (1 << 64) - 1  # the counter's part of a generation (the length's is above it)
        assert (reader.generation() & counter) - (before & counter) == 4 * CHANGES_PER_PROCESS
        assert path.stat().st_size == 8 + 4 * CHANGES_PER_PROCESS
    finally:
        reader.close()


def test_a_worker_of_an_earlier_version_still_invalidates_within_a_second(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An earlier version counted by appending a byte and read the file's length; during a rolling
    # restart after an upgrade its workers change keys that way.
    db = tmp_path / "gateway.db"
    clock = [1000.0]
    # The cache's clock only: the event loop keeps the real one.
    monkeypatch.setattr(key_cache, "time", SimpleNamespace(monotonic=lambda: clock[0]))

    async def main() -> None:
        async with started(lambda: SqliteStore(db)) as [store]:
            account = await store.create_account("acct", Decimal(1))
            secret = os.urandom(32)
            await store.create_key(account.id, "k", secret, "sk-a", None)
            assert await store.find_key(secret) is not None
            # The earlier worker deletes the key, then appends its byte.
            with sqlite3.connect(db) as other:
                other.execute("DELETE FROM api_keys WHERE key_hash = ?", (secret,))
            with _generation_file(db).open("ab") as file:
                file.write(b".")
            clock[0] += key_cache.LENGTH_CHECK_SECONDS / 2
            assert await store.find_key(secret) is not None  # its length not read again yet
            clock[0] += key_cache.LENGTH_CHECK_SECONDS
            assert await store.find_key(secret) is None

    asyncio.run(main())


def test_an_earlier_version_s_file_is_taken_over(tmp_path: Path) -> None:
    # Shorter than the counter (a fresh one of an earlier version) or longer: both work, and a
    # change still appends, for the earlier version's workers.
    for dots in (3, 50):
        path = tmp_path / f"{dots}.generation"
        path.write_bytes(b"." * dots)
        cache = KeyCache(path)
        cache.open()
        try:
            first = cache.generation()
            length = path.stat().st_size
            cache.changed()
            assert cache.generation() != first
            assert path.stat().st_size == length + 1
        finally:
            cache.close()

"""The SQLite writer's linger follows the process's load: short while few requests run (a request
that meets a commit waits for it), long while many do (larger commits cost less per row), cut short
when log bodies pile up, and never in the way of an awaited write or of closing."""

from __future__ import annotations

import asyncio
import time
from functools import partial
from pathlib import Path

import pytest
from test_store_contract import StoreFactory, account_and_key, log_entry, record, started

from gateway.store.sqlite import SqliteStore, writer
from harness import eventually_async

LONG = 60.0  # a busy linger no test waits out


async def _logged(store: SqliteStore, request_id: str) -> bool:
    return await store.get_request_log(request_id) is not None


def _following(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, running: list[int]) -> StoreFactory:
    """A store whose writer follows `running[0]`, with a busy linger no test waits out."""
    monkeypatch.setattr(writer, "BUSY_LINGER_SECONDS", LONG)

    def new_store() -> SqliteStore:
        store = SqliteStore(tmp_path / "gateway.db")
        store.follow_load(lambda: running[0])
        return store

    return new_store


def test_a_quiet_process_commits_at_once_and_a_busy_one_lingers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    running = [0]

    async def main() -> None:
        async with started(_following(tmp_path, monkeypatch, running)) as [store]:
            account_id, key_id = await account_and_key(store, "10")
            quiet = record(account_id, key_id, "0")
            store.log_request(log_entry(quiet))
            await eventually_async(lambda: _logged(store, quiet.request_id), what="the quiet entry")

            running[0] = writer.BUSY_REQUESTS  # as many requests under way as make it busy
            busy = record(account_id, key_id, "0")
            store.log_request(log_entry(busy))
            await asyncio.sleep(0.3)  # several quiet lingers, a fraction of the busy one
            assert not await _logged(store, busy.request_id)
            # An awaited write ends the linger and takes the lingering entry with it.
            await store.purge_images(0)
            assert await _logged(store, busy.request_id)
            store.log_request(log_entry(record(account_id, key_id, "0")))  # lingering at the close
            closing = time.monotonic()
        assert time.monotonic() - closing < LONG / 2  # closing does not wait the linger out

    asyncio.run(main())


def test_heavy_log_bodies_end_a_busy_linger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    running = [writer.BUSY_REQUESTS]

    async def main() -> None:
        async with started(_following(tmp_path, monkeypatch, running)) as [store]:
            account_id, key_id = await account_and_key(store, "10")
            light = record(account_id, key_id, "0")
            store.log_request(log_entry(light))
            body = b"x" * (writer.LINGER_BODY_BYTES // 2 + 1)
            heavy = [record(account_id, key_id, "0") for _ in range(2)]
            for r in heavy:
                store.log_request(log_entry(r, request_body=body, request_bytes=len(body)))
            for r in (light, *heavy):
                await eventually_async(partial(_logged, store, r.request_id), what=r.request_id)
            kept = await store.get_request_log(heavy[1].request_id)
            assert kept is not None and kept.request_body == body  # written whole, not dropped

    asyncio.run(main())


def test_the_app_tells_the_store_how_many_requests_run(tmp_path: Path) -> None:
    from gateway.app import create_app
    from gateway.config import ChannelConfig, ModelConfig, Settings

    settings = Settings(
        models=(ModelConfig("a/b", "chat", (ChannelConfig("openai", "http://127.0.0.1:9", "b"),)),),
        store_path=tmp_path / "gateway.db",
    )
    state = create_app(settings).state.gateway
    running = state.store._writer.under_way
    assert running() == 0
    state.funds.open_holds = 3
    assert running() == 3

"""A store a newer gateway has migrated (an upgrade rolled back): this gateway never runs on it,
on either backend (upgrade review: older releases started on a newer schema, said they were ready
and wrote records without what the newer release needs of them). `gateway serve` and `gateway
admin` stop with one line naming both versions; a worker's store refuses to start. A gateway
already running when a newer one migrated the store beside it stays ready (diff review: in a
rolling upgrade every instance not yet handed over left the load balancer at once)."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest

from gateway.store import SchemaTooNew, open_store
from gateway.store.postgres.migrate import migrations
from gateway.store.sqlite.schema import MIGRATIONS
from harness import StoreSpec, chat_model, free_port, store_spec


async def _mark_newer(spec: StoreSpec) -> str:
    """The store, migrated by this gateway, marked as a newer one's; returns the version it says."""
    if spec.backend == "sqlite":
        assert spec.path is not None
        with contextlib.closing(sqlite3.connect(spec.path)) as db:
            db.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
        return f"version {len(MIGRATIONS) + 1}, newer than this gateway's (version {len(MIGRATIONS)})"
    newest = max(m.version for m in migrations())
    conn = await asyncpg.connect(spec.url)
    try:
        await conn.execute("INSERT INTO schema_migrations (version, name) VALUES ($1, 'newer')", newest + 1)
    finally:
        await conn.close()
    return f"migration {newest + 1}, newer than this gateway's (migration {newest})"


def test_a_store_a_newer_gateway_migrated_is_refused(tmp_path: Path, backend: str, sim_url: str) -> None:
    with store_spec(tmp_path, backend) as spec:

        async def running_when_marked() -> tuple[str, str | None]:
            """A store started on its current schema, then a newer gateway's mark: the version the
            mark gave, and what the running store's ready() says."""
            store = open_store(spec.settings())
            await store.start()
            try:
                assert await store.ready() is None
                said = await _mark_newer(spec)
                return said, await store.ready()
            finally:
                await store.close()

        said, ready = asyncio.run(running_when_marked())
        assert ready is None, ready
        config = tmp_path / "gateway.toml"
        config.write_text(
            f"[server]\nport = {free_port()}\n{spec.toml()}" + chat_model("test/a", "sim-chat", sim_url)
        )
        for command in (["serve"], ["admin", "list-accounts"]):
            done = subprocess.run(
                [sys.executable, "-m", "gateway", *command, "--config", str(config)],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert done.returncode == 1, (command, done.stderr)
            assert done.stderr.startswith(f"gateway: the store's schema is at {said}"), done.stderr
            assert "Upgrading" in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr

        async def start() -> None:
            store = open_store(spec.settings())
            try:
                await store.start()
            finally:
                await store.close()

        with pytest.raises(SchemaTooNew, match="newer than this gateway's"):
            asyncio.run(start())

"""Numbered schema migrations: migrations/NNNN_name.sql, applied in order, each once.

Every instance runs `migrate` at start-up. The whole run is one transaction under a transaction-level
advisory lock, so instances starting together wait for the first: it applies what is missing and
records each file in schema_migrations, and the others then find nothing left to do. A migration
that fails rolls the run back entirely and the store does not start. Append new files; never edit
one that has shipped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

import asyncpg

from ..records import SchemaTooNew

# The advisory lock every instance takes to migrate (any constant; "gateway" in ASCII).
MIGRATION_LOCK = 0x67617465776179
_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


def migrations() -> list[Migration]:
    """The package's migrations in order (shipped in the wheel beside this module)."""
    found = []
    for entry in resources.files(__package__).joinpath("migrations").iterdir():
        match = _NAME.match(entry.name)
        if match is not None:
            found.append(Migration(int(match.group(1)), entry.name, entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise RuntimeError(f"migrations must be numbered 1, 2, 3, ... without gaps: {versions}")
    return found


def newer_than_known(applied: set[int]) -> SchemaTooNew | None:
    """The refusal for a database with migrations this gateway does not know (None: none)."""
    known = {m.version for m in migrations()}
    unknown = applied - known
    if not unknown:
        return None
    return SchemaTooNew(f"migration {max(unknown)}", f"migration {max(known)}")


async def migrate(conn: asyncpg.Connection) -> list[int]:
    """Apply the migrations this database lacks; returns the versions applied by this call."""
    applied: list[int] = []
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK)
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {row[0] for row in await conn.fetch("SELECT version FROM schema_migrations")}
        newer = newer_than_known(done)
        if newer is not None:
            raise newer
        for migration in migrations():
            if migration.version in done:
                continue
            await conn.execute(migration.sql)
            await conn.execute(
                "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
                migration.version,
                migration.name,
            )
            applied.append(migration.version)
    return applied

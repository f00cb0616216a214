"""The embedded store's files: the database and what is kept beside it under its name (the one
list that a backup, the gateway and its workers go by)."""

from __future__ import annotations

from pathlib import Path
from typing import Final

JOURNAL: Final = ".journal"  # a directory: each process's settlements (journal.py)
KEY_GENERATION: Final = ".generation"  # the key cache's change counter (key_cache.py)
RATE_LIMITS: Final = ".ratelimits"  # the rate-limit buckets (rust/core/src/shared_buckets.rs)
SQLITE_OWN: Final = ("-wal", "-shm", "-journal")  # SQLite's own, applied or discarded at an open


def beside(db: Path, end: str) -> Path:
    """The file `end` names beside the database (`gateway.db` and `.journal`: `gateway.db.journal`)."""
    return db.with_name(db.name + end)


def owned(db: Path) -> frozenset[Path]:
    """Every file the store keeps under its name, the database and its journal directory with them."""
    return frozenset({db, *(beside(db, end) for end in (*SQLITE_OWN, JOURNAL, KEY_GENERATION, RATE_LIMITS))})

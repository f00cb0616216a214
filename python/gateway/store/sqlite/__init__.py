"""The embedded store: SQLite, with a settlement journal per process (see store.py)."""

from .store import SqliteStore

__all__ = ["SqliteStore"]

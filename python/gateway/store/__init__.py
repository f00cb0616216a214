"""Persistence behind one interface (`Store`), one module per backend."""

from .base import Account, ApiKey, KeyContext, Store, UsageRecord

__all__ = ["Account", "ApiKey", "KeyContext", "Store", "UsageRecord", "open_store"]


def open_store(path: str) -> Store:
    from .sqlite import SqliteStore

    return SqliteStore(path)

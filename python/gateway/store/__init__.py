"""Persistence behind one interface (`Store`), one module per backend."""

from .base import (
    LIMIT_RESETS,
    Account,
    AccountChanges,
    ApiKey,
    IdempotencyClaim,
    IdempotencyKeyReused,
    KeyChanges,
    KeyContext,
    NameTaken,
    RequestLog,
    ResponseState,
    Store,
    StoredAnswer,
    StoredImage,
    TopUp,
    UsageRecord,
    VideoJob,
)

__all__ = [
    "LIMIT_RESETS",
    "Account",
    "AccountChanges",
    "ApiKey",
    "IdempotencyClaim",
    "IdempotencyKeyReused",
    "KeyChanges",
    "KeyContext",
    "NameTaken",
    "RequestLog",
    "ResponseState",
    "Store",
    "StoredAnswer",
    "StoredImage",
    "TopUp",
    "UsageRecord",
    "VideoJob",
    "open_store",
]


def open_store(path: str) -> Store:
    from .sqlite import SqliteStore

    return SqliteStore(path)

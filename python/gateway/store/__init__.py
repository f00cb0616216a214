"""Persistence behind one interface (`Store`), one module per backend."""

from .base import (
    JOB_RUNNING,
    LIMIT_RESETS,
    Account,
    AccountChanges,
    ApiKey,
    IdempotencyClaim,
    IdempotencyKeyReused,
    Job,
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
)

__all__ = [
    "JOB_RUNNING",
    "LIMIT_RESETS",
    "Account",
    "AccountChanges",
    "ApiKey",
    "IdempotencyClaim",
    "IdempotencyKeyReused",
    "Job",
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
    "open_store",
]


def open_store(path: str) -> Store:
    from .sqlite import SqliteStore

    return SqliteStore(path)

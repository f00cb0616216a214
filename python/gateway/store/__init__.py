"""Persistence behind one interface cut by role (store/base.py), one package per backend: sqlite
(embedded, the default) and postgres (several instances sharing one database)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import (
    Accounts,
    Blobs,
    Console,
    Idempotency,
    Jobs,
    Ledger,
    RequestLogs,
    ResponseStates,
    Store,
)
from .records import (
    JOB_RUNNING,
    LIMIT_RESETS,
    Account,
    AccountChanges,
    ApiKey,
    ChatMessage,
    ConsoleSession,
    ConsoleUser,
    Conversation,
    ConversationGap,
    IdempotencyClaim,
    IdempotencyKeyReused,
    Job,
    KeptAnswer,
    KeptResponse,
    KeyChanges,
    KeyContext,
    LogBucket,
    LogQuery,
    LogStats,
    NameTaken,
    RequestLog,
    ResponseState,
    SchemaTooNew,
    Settlement,
    StoredAnswer,
    StoredImage,
    TopUp,
    UsageRecord,
)

if TYPE_CHECKING:
    from ..config import Settings

__all__ = [
    "JOB_RUNNING",
    "LIMIT_RESETS",
    "Account",
    "AccountChanges",
    "Accounts",
    "ApiKey",
    "Blobs",
    "ChatMessage",
    "Console",
    "ConsoleSession",
    "ConsoleUser",
    "Conversation",
    "ConversationGap",
    "Idempotency",
    "IdempotencyClaim",
    "IdempotencyKeyReused",
    "Job",
    "Jobs",
    "KeptAnswer",
    "KeptResponse",
    "KeyChanges",
    "KeyContext",
    "Ledger",
    "LogBucket",
    "LogQuery",
    "LogStats",
    "NameTaken",
    "RequestLog",
    "RequestLogs",
    "ResponseState",
    "ResponseStates",
    "SchemaTooNew",
    "Settlement",
    "Store",
    "StoredAnswer",
    "StoredImage",
    "TopUp",
    "UsageRecord",
    "open_store",
]


def open_store(settings: Settings) -> Store:
    """The backend `[store] backend` names (not yet started)."""
    if settings.store_backend == "postgres":
        from .postgres import PostgresStore

        if settings.store_url is None:
            raise ValueError("store.url is required for the postgres backend")
        return PostgresStore(settings.store_url, pool_size=settings.store_pool_size)
    from .sqlite import SqliteStore

    return SqliteStore(settings.store_path)

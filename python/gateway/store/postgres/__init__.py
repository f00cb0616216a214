"""The store on PostgreSQL (asyncpg), for several gateway instances on one database: see store.py."""

from .errors import StoreUnavailable
from .store import HEARTBEAT_SECONDS, OWNER_TIMEOUT_SECONDS, PostgresStore

__all__ = ["HEARTBEAT_SECONDS", "OWNER_TIMEOUT_SECONDS", "PostgresStore", "StoreUnavailable"]

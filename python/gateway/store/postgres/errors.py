"""How the PostgreSQL store fails when the database is out of reach."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TypeVar

import asyncpg

from ...errors import ServiceUnavailable


class StoreUnavailable(ServiceUnavailable):
    """The database could not be reached (refused, reset, shut down, timed out, out of connections):
    the operation did not happen, or, for a settlement, has not committed yet (it stays queued and
    commits when the database is back). Raised by every store method in place of the driver's
    connection errors; being the gateway's 503 `service_unavailable`, a request that meets it gets
    that answer in the spec's format (and is logged, released, never charged twice)."""

    def __init__(self, detail: str = "") -> None:
        super().__init__("database")
        self.detail = detail

    def __str__(self) -> str:
        return self.detail or self.message


def unavailable(exc: BaseException) -> bool:
    """True for the errors that mean the database is out of reach rather than a refused statement."""
    if isinstance(
        exc,
        StoreUnavailable
        | OSError
        | TimeoutError
        | asyncpg.PostgresConnectionError  # class 08, and a connection that dropped
        | asyncpg.exceptions.OperatorInterventionError  # 57: shut down, starting up, cancelled
        | asyncpg.exceptions.InsufficientResourcesError,  # 53: too many connections, disk full
    ):
        return True
    # The driver's own "connection is closed" / "connection was closed in the middle of operation",
    # and a connection left in a broken state by a server going away mid-operation ("cannot switch
    # to state ...; another operation is in progress"): the pool replaces such a connection.
    if isinstance(exc, asyncpg.exceptions._base.InternalClientError):
        return True
    return isinstance(exc, asyncpg.InterfaceError) and "closed" in str(exc)


T = TypeVar("T")


async def connects_refused(connecting: Awaitable[T]) -> T:
    """A new connection; any failure to make one is StoreUnavailable, whatever the server said:
    down, starting, out of connections, or a database not accepting connections (55000, during
    maintenance: review, it was taken for a refused statement and the settlements it carried were
    dropped). No statement ran, so waiting and trying again is always right."""
    try:
        return await connecting
    except StoreUnavailable:
        raise
    except Exception as exc:
        raise StoreUnavailable(f"PostgreSQL refused a connection: {exc}") from exc

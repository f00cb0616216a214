"""What the gateway keeps, and the interface every backend implements."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class Account:
    id: str
    name: str
    balance: Decimal
    # None: every configured model is allowed.
    allowed_models: frozenset[str] | None = None


@dataclass(frozen=True, slots=True)
class ApiKey:
    id: str
    account_id: str
    name: str
    prefix: str  # the first characters of the key, for people to recognise it; never enough to use it
    created_at_ms: int
    expires_at_ms: int | None = None


@dataclass(frozen=True, slots=True)
class KeyContext:
    """Who is calling: the key and its account, as found at authentication."""

    key: ApiKey
    account: Account


@dataclass(frozen=True, slots=True)
class UsageRecord:
    """Spec 2.3. `id` is the response body's id; the record belongs to the key that made the request."""

    id: str
    request_id: str
    key_id: str
    account_id: str
    model: str
    status: str  # completed | incomplete | failed
    prompt_tokens: int
    completion_tokens: int
    cost: Decimal
    started_at_ms: int
    ended_at_ms: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def duration_ms(self) -> int:
        return self.ended_at_ms - self.started_at_ms

    # The record as one flat row, in USAGE_COLUMNS order (money as decimal text): the one mapping
    # shared by every backend and the settlement journal.
    def as_row(self) -> tuple[str, str, str, str, str, str, int, int, str, int, int]:
        return (
            self.id,
            self.request_id,
            self.key_id,
            self.account_id,
            self.model,
            self.status,
            self.prompt_tokens,
            self.completion_tokens,
            str(self.cost),
            self.started_at_ms,
            self.ended_at_ms,
        )

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> UsageRecord:
        return cls(
            row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], Decimal(row[8]), row[9], row[10]
        )


USAGE_COLUMNS = (
    "id",
    "request_id",
    "key_id",
    "account_id",
    "model",
    "status",
    "prompt_tokens",
    "completion_tokens",
    "cost",
    "started_at_ms",
    "ended_at_ms",
)


class Store(Protocol):
    async def start(self) -> None:
        """Open connections, create or migrate the schema."""

    async def close(self) -> None:
        """Flush pending writes and close."""

    async def find_key(self, key_hash: bytes) -> KeyContext | None:
        """The live (not deleted) key with this hash, with its account."""

    def settle(self, record: UsageRecord) -> None:
        """Store the usage record and charge its cost, atomically and exactly once. Returns at once;
        from then on the charge survives a killed process. The record is readable moments later."""

    async def get_usage(self, usage_id: str, key_id: str) -> UsageRecord | None:
        """The record, only if it belongs to this key."""

    async def create_account(self, name: str, balance: Decimal) -> Account: ...

    async def find_account(self, name: str) -> Account | None: ...

    async def create_key(
        self, account_id: str, name: str, key_hash: bytes, prefix: str, expires_at_ms: int | None
    ) -> ApiKey: ...

    async def delete_key(self, key_id: str) -> bool: ...

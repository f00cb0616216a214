"""Where a request's cost is decided and settled: one place for every endpoint."""

from __future__ import annotations

import time
from dataclasses import dataclass
from decimal import Decimal

from . import budget
from .config import ModelConfig
from .errors import GatewayError
from .pricing import Usage, cost
from .store import KeyContext, Store, UsageRecord


@dataclass(slots=True)
class Call:
    """One authenticated model request, from the moment its key was accepted."""

    ctx: KeyContext
    request_id: str
    started_ns: int


def require_funds(ctx: KeyContext, now_ms: int | None = None) -> None:
    """Spec 7.5.1: at or below zero, every request is refused, free models included; and spec 5.4:
    a key whose own credit limit is used up is refused even when the account has credits."""
    if ctx.account.balance <= 0:
        raise GatewayError("insufficient_credits", "The account has no credits left. Add credits and retry.")
    if budget.is_exhausted(ctx.key, now_ms):
        raise GatewayError(
            "key_budget_exceeded",
            "This key's credit limit is used up. Raise the limit, wait for its reset, or use another key.",
        )


def _record(call: Call, model: ModelConfig, response_id: str, status: str, usage: Usage) -> UsageRecord:
    return UsageRecord(
        id=response_id,
        request_id=call.request_id,
        key_id=call.ctx.key.id,
        account_id=call.ctx.account.id,
        model=model.name,
        status=status,
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        cost=cost(model.prices, usage),
        started_at_ms=call.started_ns // 1_000_000,
        ended_at_ms=time.time_ns() // 1_000_000,
    )


def settle(
    store: Store, call: Call, model: ModelConfig, response_id: str, status: str, usage: Usage
) -> Decimal:
    """Record the usage and charge its cost, exactly once; survives a killed process from the moment
    this returns (see store/journal.py). Returns the charged cost."""
    record = _record(call, model, response_id, status, usage)
    store.settle(record)
    return record.cost

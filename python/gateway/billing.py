"""Where a request's cost is decided and settled: one place for every endpoint.

Every model request holds its estimated cost before it runs (gateway.funds) and, when it ends,
either settles to its actual cost (a usage record and a charge) or, when it is not billed, releases
the hold; model_endpoint releases whatever a handler left open, so no hold leaks.
"""

from __future__ import annotations

import time
from decimal import Decimal
from typing import Any

from .config import ModelConfig
from .context import Call
from .estimates import TextEstimate
from .funds import NotCovered
from .pricing import Usage, cost
from .state import GatewayState
from .store import UsageRecord


def estimate_usage(
    model: ModelConfig, prompt_tokens: int, payload: dict[str, Any] | None = None, *limits: str
) -> Usage:
    """The most a text request may consume: its whole prompt and as much output as it may produce
    (the first of the request's `limits` parameters it sets, never more than the model's
    max_output_tokens, for each of the `n` choices it asks for), all of that output at the dearer
    of the output and reasoning prices. It knows which of `limits` the request set, so that a
    refusal can name the largest value that fits (gateway.estimates)."""
    output, limit_set = model.max_output_tokens, None
    for name in limits:
        value = positive_int(None if payload is None else payload.get(name))
        if value is not None:
            output, limit_set = min(value, output), name
            break
    choices = positive_int(None if payload is None else payload.get("n")) or 1
    output *= choices
    reasoning = output if model.prices.reasoning > model.prices.output else 0
    return TextEstimate(
        prompt_tokens=prompt_tokens,
        completion_tokens=output,
        reasoning_tokens=reasoning,
        limits=limits,
        limit_set=limit_set,
        choices=choices,
    )


def positive_int(value: Any) -> int | None:
    """A request field that must be a positive integer (JSON true is not one), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


async def hold(
    state: GatewayState, call: Call, model: ModelConfig, estimate: Usage, now_ms: int | None = None
) -> None:
    """Set the estimated cost aside on the account and the key's limit, or refuse the request with
    insufficient_credits / key_budget_exceeded before it runs (spec 5.4, 7.5.1, 8), saying the most
    it could cost and, for a text request, the largest output limit the money covers. Its tokens
    are reserved first (gateway.ratelimits: 400 when they can never fit, 429 when not yet)."""
    call.model = model.name
    state.limiter.reserve(call.rate, estimate, model.type)
    try:
        call.hold = await state.funds.hold(call.ctx, cost(model.prices, estimate), now_ms)
    except NotCovered as refused:
        raise refused.explained(model.prices, estimate, state.registry.forwarded_params(model)) from None


def release(state: GatewayState, call: Call) -> None:
    """The request ended without a charge (refused, failed upstream, nothing streamed)."""
    if call.hold is not None:
        state.funds.release(call.hold, Decimal(0))
    state.limiter.correct(call.rate, 0)


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
    state: GatewayState, call: Call, model: ModelConfig, response_id: str, status: str, usage: Usage
) -> Decimal:
    """Record the usage and charge its cost, exactly once, and close the hold; survives a killed
    process from the moment this returns (see store/journal.py). Returns the charged cost."""
    record = _record(call, model, response_id, status, usage)
    state.store.settle(record)
    call.model, call.charged, call.usage_id = model.name, record.cost, record.id
    if call.hold is not None:
        state.funds.release(call.hold, record.cost)
    state.limiter.correct(call.rate, usage.total_tokens)
    return record.cost

"""The output limit a refusal suggests is one the money covers, priced as the hold prices it
(review: with a cache-write price above the input price, as Claude's, the suggestion and the
prompt's quoted cost were figured at the input price, below the hold's)."""

from __future__ import annotations

from decimal import Decimal

from gateway.config import Prices
from gateway.estimates import TextEstimate
from gateway.funds import largest_output
from gateway.pricing import cost

CLAUDE = Prices(input=Decimal("3.00"), output=Decimal("15.00"), cache_write=Decimal("3.75"))


def test_the_suggested_limit_is_covered_as_the_hold_prices_it() -> None:
    prompt = 100_000
    asked = TextEstimate(
        prompt_tokens=prompt,
        completion_tokens=64_000,
        cache_write_tokens=prompt,  # as billing.estimate_usage holds it when cache writes cost more
        limits=("max_tokens",),
        limit_set="max_tokens",
    )
    available = Decimal("0.50")
    largest = largest_output(CLAUDE, asked, available)
    assert largest > 0
    held = TextEstimate(
        prompt_tokens=prompt, completion_tokens=largest, cache_write_tokens=prompt, limits=("max_tokens",)
    )
    assert cost(CLAUDE, held) <= available
    more = TextEstimate(
        prompt_tokens=prompt, completion_tokens=largest + 1, cache_write_tokens=prompt, limits=("max_tokens",)
    )
    assert cost(CLAUDE, more) > available

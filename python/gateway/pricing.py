"""The one pricing function: what a finished request costs, exact, rounded to 4 significant figures.

The rounded amount is what x-service-cost shows, what the usage record shows and exactly what the
balance loses (spec 1.4, 4 note 3).
"""

from __future__ import annotations

import dataclasses
from decimal import ROUND_HALF_UP, Context, Decimal
from typing import TypeAlias

import orjson

from .config import Prices
from .core import StreamUsage
from .frozen import frozen

# Prices are per million: a product by 10**-6 (exact, an exponent's shift) rather than a division, a
# third of its instructions.
_PER_MILLION = Decimal("0.000001")
_SECONDS_PER_MINUTE = Decimal(60)
ZERO = Decimal(0)
# What a cost is rounded to (spec 1.4): 4 significant figures, half up.
_FOUR_FIGURES = Context(prec=4, rounding=ROUND_HALF_UP)


@frozen
class Usage:
    """What a request consumed. completion_tokens includes reasoning_tokens, prompt_tokens includes
    cached_tokens (read from the provider's cache), as in the OpenAI usage object, and
    cache_write_tokens (written to it: Anthropic's and Bedrock's cache writes). The kinds some
    models price apart are parts too: of the prompt, its audio (audio_prompt_tokens) and an image
    edit's input images (image_prompt_tokens); of the cache writes, those kept an hour
    (cache_write_1h_tokens); of the output, its audio (audio_completion_tokens)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    cache_write_tokens: int = 0
    audio_prompt_tokens: int = 0
    image_prompt_tokens: int = 0
    cache_write_1h_tokens: int = 0
    audio_completion_tokens: int = 0
    searches: int = 0  # rerank search units
    characters: int = 0  # speech input
    seconds: int = 0  # audio transcribed, whole seconds rounded up
    images: int = 0  # images generated or edited
    image_size: str | None = None  # as the request asked (prices may differ by size and quality)
    image_quality: str | None = None

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


# An upstream's token counts: the Rust core's, or a pricing.Usage read by a shape translator
# (gateway.translate).
ReportedUsage: TypeAlias = "StreamUsage | Usage"


def reported_usage(reported: ReportedUsage) -> Usage:
    """The gateway's Usage of what an upstream reported. The core's counts come in one call, in
    Usage's order (StreamUsage.counts): nine getters and keywords cost ~0.5 us more."""
    if isinstance(reported, Usage):
        return reported
    return Usage(*reported.counts)


def cost(prices: Prices, usage: Usage) -> Decimal:
    """What `usage` costs at `prices`, exact, rounded to 4 significant figures. Only the kinds the
    request consumed are computed (a chat request: two products), which is the same sum: this runs
    twice a request (the hold's estimate and the charge). Conditional expressions, not min(): the
    builtin costs ~1,100 instructions a call, ten times as much (benches/instructions.py).

    A part an upstream reports larger than what it is part of is taken as all of it: cached, then
    written, of the prompt; audio, then images, of the rest (fresh input); the hour's of the
    writes; reasoning, then audio, of the output."""
    prompt, completion = usage.prompt_tokens, usage.completion_tokens
    cached = usage.cached_tokens if usage.cached_tokens < prompt else prompt
    unread = prompt - cached
    written = usage.cache_write_tokens if usage.cache_write_tokens < unread else unread
    reasoning = usage.reasoning_tokens if usage.reasoning_tokens < completion else completion
    per_million = ZERO
    if prompt:
        fresh = prompt - cached - written
        if usage.audio_prompt_tokens or usage.image_prompt_tokens:
            audio = usage.audio_prompt_tokens if usage.audio_prompt_tokens < fresh else fresh
            fresh -= audio
            images = usage.image_prompt_tokens if usage.image_prompt_tokens < fresh else fresh
            fresh -= images
            per_million += audio * prices.audio_input + images * prices.image_input
        per_million += fresh * prices.input
    if cached:
        per_million += cached * prices.cached_input
    if written:
        hour = usage.cache_write_1h_tokens if usage.cache_write_1h_tokens < written else written
        per_million += (written - hour) * prices.cache_write
        if hour:
            per_million += hour * prices.cache_write_1h
    if completion:
        spoken = 0
        if usage.audio_completion_tokens:
            rest = completion - reasoning
            spoken = usage.audio_completion_tokens if usage.audio_completion_tokens < rest else rest
            per_million += spoken * prices.audio_output
        per_million += (completion - reasoning - spoken) * prices.output
    if reasoning:
        per_million += reasoning * prices.reasoning
    if usage.characters:
        per_million += usage.characters * prices.character
    raw = per_million * _PER_MILLION
    if usage.searches:
        raw += usage.searches * prices.search
    if usage.seconds:
        raw += usage.seconds * prices.second + usage.seconds * prices.minute / _SECONDS_PER_MINUTE
    if usage.images:
        raw += usage.images * prices.image_price(usage.image_size, usage.image_quality)
    return round_significant(raw)


def prices_text(prices: Prices) -> str:
    """`prices` as JSON text (money as decimal strings), as a job keeps the prices it was held at."""
    return orjson.dumps(prices, default=str).decode()  # orjson writes the dataclass; str the Decimals


def prices_of_text(text: str) -> Prices:
    """The Prices prices_text wrote (a field it does not know, of a later version, is left out)."""
    data = orjson.loads(text)
    known = {f.name for f in dataclasses.fields(Prices)} - {"images"}
    images = tuple((str(variant), Decimal(price)) for variant, price in data.get("images", ()))
    return Prices(**{k: Decimal(v) for k, v in data.items() if k in known}, images=images)


def round_significant(value: Decimal) -> Decimal:
    """`value` to 4 significant figures, half up, without trailing zeros: the context's rounding
    does in one step what quantizing at the value's own exponent did in four (0.36 against 1.37 us;
    tests/test_pricing.py keeps that way as the reference)."""
    return value.normalize(_FOUR_FIGURES)


def format_cost(value: Decimal) -> str:
    """Plain decimal notation, never an exponent: 0.0001234, 12.5, 0. A request's charge is
    written twice (its x-service-cost header, its metrics and log line), each ~3,300 instructions:
    the last value written is kept, by identity (it is held, so its id cannot be reused)."""
    global _last_formatted  # noqa: PLW0603 (one tuple, replaced whole)
    last, text = _last_formatted
    if value is last:
        return text
    text = "0" if value.is_zero() else format(value.normalize(), "f")
    _last_formatted = (value, text)
    return text


_last_formatted: tuple[Decimal | None, str] = (None, "")


def cost_number(value: Decimal) -> orjson.Fragment:
    """A cost as a JSON number with exactly format_cost's digits (the header's): written as its own
    token, never through a float, which orjson would write as 3e-6."""
    return orjson.Fragment(format_cost(value))

"""The pricing function: exact Decimal arithmetic, four significant figures."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

from hypothesis import example, given
from hypothesis import strategies as st

from gateway.config import Prices
from gateway.pricing import Usage, cost, format_cost, prices_of_text, prices_text, round_significant

PRICES = Prices(
    input=Decimal("2.50"), cached_input=Decimal("1.25"), output=Decimal("10"), reasoning=Decimal("12")
)


def test_cost_of_each_token_kind() -> None:
    usage = Usage(prompt_tokens=1000, completion_tokens=500, cached_tokens=400, reasoning_tokens=100)
    # 600 * 2.50 + 400 * 1.25 + 400 * 10 + 100 * 12 = 1500 + 500 + 4000 + 1200 = 7200 per million
    assert cost(PRICES, usage) == Decimal("0.0072")


def test_rounding_to_four_significant_figures() -> None:
    assert round_significant(Decimal("0.000123456")) == Decimal("0.0001235")
    assert round_significant(Decimal("123456")) == Decimal("123500")
    assert round_significant(Decimal("0.00012345")) == Decimal("0.0001235")  # half up
    assert round_significant(Decimal(0)) == 0
    assert format_cost(Decimal("0.0001235")) == "0.0001235"
    assert format_cost(Decimal("123500")) == "123500"
    assert format_cost(Decimal(0)) == "0"
    assert format_cost(Decimal("1.5E-7")) == "0.00000015"


def _quantized(value: Decimal) -> Decimal:
    """The rounding as it was first written: quantized at the value's own exponent, half up."""
    if value.is_zero():
        return Decimal(0)
    quantum = Decimal(1).scaleb(value.adjusted() - 3)
    return value.quantize(quantum, rounding=ROUND_HALF_UP).normalize()


@example(Decimal("9.9995"))  # rounds up to a fifth digit: 10
@example(Decimal("0E-9"))
@given(st.builds(lambda c, e: Decimal(c).scaleb(e), st.integers(0, 10**27), st.integers(-30, 10)))
def test_round_significant_is_quantizing_at_four_figures(value: Decimal) -> None:
    rounded = round_significant(value)
    assert rounded == _quantized(value)
    assert str(rounded) == str(_quantized(value))  # the same digits and exponent, not only equal


@given(
    st.decimals(min_value=Decimal("1e-12"), max_value=Decimal("1e9"), allow_nan=False, allow_infinity=False)
)
def test_round_significant_properties(value: Decimal) -> None:
    rounded = round_significant(value)
    assert len(rounded.as_tuple().digits) <= 4
    assert abs(rounded - value) <= abs(value) * Decimal("0.0005") * 10
    assert round_significant(rounded) == rounded
    assert Decimal(format_cost(rounded)) == rounded
    assert "E" not in format_cost(rounded)


@given(st.integers(0, 10**7), st.integers(0, 10**7))
def test_cost_is_monotonic_in_tokens(prompt: int, completion: int) -> None:
    base = cost(PRICES, Usage(prompt, completion))
    assert cost(PRICES, Usage(prompt + 1, completion)) >= base
    assert cost(PRICES, Usage(prompt, completion + 1)) >= base


def test_transcription_per_second_and_per_minute() -> None:
    per_minute = Prices(minute=Decimal("0.006"))
    assert cost(per_minute, Usage(seconds=90)) == Decimal("0.009")
    # $0.01 a minute is no whole number of micro-dollars a second: exact until the final rounding.
    assert cost(Prices(minute=Decimal("0.01")), Usage(seconds=7)) == Decimal("0.001167")
    assert cost(Prices(second=Decimal("0.0001")), Usage(seconds=7)) == Decimal("0.0007")


def test_images_priced_by_size_and_quality() -> None:
    prices = Prices(
        image=Decimal("0.04"),
        images=(
            ("1024x1024/hd", Decimal("0.08")),
            ("1024x1792", Decimal("0.08")),
            ("1024x1792/hd", Decimal("0.12")),
        ),
    )
    assert prices.image_price("1024x1024", "hd") == Decimal("0.08")
    assert prices.image_price("1024x1024", "standard") == Decimal("0.04")  # no entry: the default
    assert prices.image_price("1024x1792", "standard") == Decimal("0.08")  # the size's entry
    assert prices.image_price("1024x1792", "hd") == Decimal("0.12")
    assert prices.image_price(None, None) == Decimal("0.04")
    # No size (dall-e-3's answers name none): the quality's cheapest, its default size's.
    assert prices.image_price(None, "hd") == Decimal("0.08")
    assert prices.image_price(None, "standard") == Decimal("0.04")  # none listed: the default
    usage = Usage(images=2, image_size="1024x1792", image_quality="hd")
    assert cost(prices, usage) == Decimal("0.24")


def _every_term(prices: Prices, usage: Usage) -> Decimal:
    """The pricing formula with every term written out, zero or not (what cost() computed before it
    skipped the kinds a request did not consume)."""
    cached = min(usage.cached_tokens, usage.prompt_tokens)
    reasoning = min(usage.reasoning_tokens, usage.completion_tokens)
    raw = (
        (
            (usage.prompt_tokens - cached) * prices.input
            + cached * prices.cached_input
            + (usage.completion_tokens - reasoning) * prices.output
            + reasoning * prices.reasoning
            + usage.characters * prices.character
        )
        / Decimal(1_000_000)
        + usage.searches * prices.search
        + usage.seconds * prices.second
        + usage.seconds * prices.minute / Decimal(60)
        + usage.images * prices.image_price(usage.image_size, usage.image_quality)
    )
    return round_significant(raw)


_price = st.decimals(min_value=0, max_value=Decimal("1000"), places=6, allow_nan=False, allow_infinity=False)
_count = st.one_of(st.just(0), st.integers(0, 10**8))


@given(
    st.builds(
        Prices,
        input=_price,
        cached_input=_price,
        output=_price,
        reasoning=_price,
        search=_price,
        character=_price,
        second=_price,
        minute=_price,
        image=_price,
        images=st.just((("1024x1024/hd", Decimal("0.08")), ("1024x1024", Decimal("0.04")))),
    ),
    st.builds(
        Usage,
        prompt_tokens=_count,
        completion_tokens=_count,
        cached_tokens=_count,
        reasoning_tokens=_count,
        searches=_count,
        characters=_count,
        seconds=_count,
        images=st.integers(0, 10),
        image_size=st.sampled_from([None, "1024x1024", "512x512"]),
        image_quality=st.sampled_from([None, "hd", "standard"]),
    ),
)
def test_cost_is_the_whole_formula(prices: Prices, usage: Usage) -> None:
    assert cost(prices, usage) == _every_term(prices, usage)


def test_cache_reads_and_writes_each_at_their_price() -> None:
    prices = Prices(
        input=Decimal(3), cached_input=Decimal("0.30"), cache_write=Decimal("3.75"), output=Decimal(15)
    )
    usage = Usage(prompt_tokens=1000, completion_tokens=100, cached_tokens=600, cache_write_tokens=300)
    # 100 * 3 + 600 * 0.30 + 300 * 3.75 + 100 * 15 = 300 + 180 + 1125 + 1500 = 3105 per million
    assert cost(prices, usage) == Decimal("0.003105")
    # Counts beyond the prompt are the prompt's: written tokens are at most what was not read
    # (600 * 0.30 + 400 * 3.75 = 1680 per million).
    assert cost(prices, Usage(1000, 0, cached_tokens=600, cache_write_tokens=5000)) == Decimal("0.00168")


_money = st.decimals(min_value=0, max_value=1_000_000, places=12, allow_nan=False, allow_infinity=False)


@given(
    st.builds(
        Prices,
        input=_money,
        output=_money,
        second=_money,
        reasoning=_money,
        images=st.lists(st.tuples(st.sampled_from(["1024x1024", "1024x1024/hd", "512x512"]), _money)).map(
            tuple
        ),
    )
)
def test_prices_kept_as_text_come_back_exactly(prices: Prices) -> None:
    """A job keeps the prices it was held at as text (Job.prices) and is charged at them."""
    assert prices_of_text(prices_text(prices)) == prices

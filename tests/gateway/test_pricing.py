"""The pricing function: exact Decimal arithmetic, four significant figures."""

from __future__ import annotations

from decimal import Decimal

from hypothesis import given
from hypothesis import strategies as st

from gateway.config import Prices
from gateway.pricing import Usage, cost, format_cost, round_significant

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
    usage = Usage(images=2, image_size="1024x1792", image_quality="hd")
    assert cost(prices, usage) == Decimal("0.24")

"""Prompt caching's two prices: tokens read from the provider's cache at `cached_input`, tokens
written to it at `cache_write` (Anthropic bills writes at 1.25x input), in the answer's usage, the
charge and the hold, through the anthropic client and through the chat shape's translation."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import anthropic
import pytest

from gateway.config import Prices
from gateway.pricing import Usage, cost
from harness import Gateway, gateway

MODEL = "anthropic/claude-sonnet-4-5"
PRICES = Prices(
    input=Decimal(3), cached_input=Decimal("0.30"), cache_write=Decimal("3.75"), output=Decimal(15)
)


def models(sim_url: str) -> str:
    return f"""
[[models]]
name = "{MODEL}"
type = "messages"
max_output_tokens = 64
[models.prices]
input = "3"
cached_input = "0.30"
cache_write = "3.75"
output = "15"
[[models.channels]]
provider = "anthropic"
base_url = "{sim_url}"
model = "claude-sonnet-4-5"
"""


@pytest.fixture(scope="module")
def cgw(sim_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with gateway(tmp_path_factory.mktemp("prompt-cache"), models(sim_url)) as g:
        yield g


def cached_system(marker: str) -> list[Any]:
    rules = f"{marker} " + "Answer as a patient librarian would, citing shelves. " * 40
    return [{"type": "text", "text": rules, "cache_control": {"type": "ephemeral"}}]


def charged(usage: anthropic.types.Usage) -> Decimal:
    read = usage.cache_read_input_tokens or 0
    written = usage.cache_creation_input_tokens or 0
    prompt = usage.input_tokens + read + written
    return cost(PRICES, Usage(prompt, usage.output_tokens, cached_tokens=read, cache_write_tokens=written))


@pytest.mark.parametrize("stream", [False, True])
def test_a_cache_write_then_a_read_are_each_billed_at_their_price(cgw: Gateway, stream: bool) -> None:
    handle = cgw.new_key(balance="5")
    system = cached_system(uuid.uuid4().hex)
    spent = Decimal(0)
    with anthropic.Anthropic(api_key=handle.key, base_url=cgw.url, max_retries=0) as claude:
        for turn in ("write", "read"):
            messages: list[Any] = [{"role": "user", "content": f"{turn} [sim tokens=4]"}]
            if stream:
                with claude.messages.stream(
                    model=MODEL, max_tokens=16, system=system, messages=messages
                ) as s:
                    usage = s.get_final_message().usage
            else:
                usage = claude.messages.create(
                    model=MODEL, max_tokens=16, system=system, messages=messages
                ).usage
            if turn == "write":
                assert usage.cache_creation_input_tokens and not usage.cache_read_input_tokens
            else:
                assert usage.cache_read_input_tokens and not usage.cache_creation_input_tokens
            spent += charged(usage)
    # Above the input price for the write, below it for the read: each at its own price.
    assert cgw.wait_balance(handle.account_id, Decimal(5) - spent) == Decimal(5) - spent


def test_the_chat_shape_reports_cache_writes_as_openrouter_does(cgw: Gateway) -> None:
    """A chat client cannot mark breakpoints, but a messages model's cache writes are prompt tokens
    priced apart all the same; they show as prompt_tokens_details.cache_write_tokens."""
    from gateway.translate.usage import chat_usage, messages_usage

    usage = Usage(100, 5, cached_tokens=10, cache_write_tokens=60)
    assert chat_usage(usage)["prompt_tokens_details"] == {"cached_tokens": 10, "cache_write_tokens": 60}
    assert messages_usage(usage) == {
        "input_tokens": 30,
        "output_tokens": 5,
        "cache_creation_input_tokens": 60,
        "cache_read_input_tokens": 10,
    }
    assert chat_usage(Usage(100, 5))["prompt_tokens_details"] == {"cached_tokens": 0}


def test_the_hold_covers_a_prompt_written_to_the_cache(cgw: Gateway, tmp_path: Path) -> None:
    """A prompt may all be written to the cache: the hold prices it at the dearer cache-write
    price, so a balance that covers the input price only is refused before the upstream runs."""
    system = cached_system(uuid.uuid4().hex)
    with anthropic.Anthropic(api_key=cgw.new_key().key, base_url=cgw.url, max_retries=0) as claude:
        probe = claude.messages.create(
            model=MODEL, max_tokens=1, system=system, messages=[{"role": "user", "content": "x"}]
        ).usage
    prompt = (
        probe.input_tokens + (probe.cache_creation_input_tokens or 0) + (probe.cache_read_input_tokens or 0)
    )
    at_input = cost(PRICES, Usage(prompt, 64))
    at_write = cost(PRICES, Usage(prompt, 64, cache_write_tokens=prompt))
    assert at_write > at_input
    poor = cgw.new_key(balance=str(at_input))
    with (
        anthropic.Anthropic(api_key=poor.key, base_url=cgw.url, max_retries=0) as claude,
        pytest.raises(anthropic.BadRequestError, match="insufficient_credits"),
    ):
        claude.messages.create(
            model=MODEL,
            max_tokens=64,
            system=cached_system(uuid.uuid4().hex),
            messages=[{"role": "user", "content": "x"}],
        )


def test_model_group_info_shows_the_cache_write_price(cgw: Gateway) -> None:
    with cgw.client(cgw.new_key().key) as http:
        info = http.get("/model_group/info", params={"model_group": MODEL}).json()
    assert info["data"][0]["cache_write_cost_per_million_tokens"] == "3.75"

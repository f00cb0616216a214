"""Google Gemini channels (provider = "gemini", the Generative Language API): chat completions said
as generateContent and back, streamGenerateContent's events as chat chunks, thinking billed as
output, through the official openai and anthropic clients."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionToolParam
from test_responses_translation import check_responses_shape

from gateway.config import Prices
from gateway.core import count_chat_tokens, count_tokens
from gateway.pricing import Usage, cost
from harness import Gateway, chat_stream, gateway

MODEL = "google/gemini-2.5-flash"
EMBED = "google/gemini-embedding-001"
UPSTREAM = "gemini-2.5-flash"
# As the config below prices it (reasoning costs the output price when not set apart).
PRICES = Prices(input=Decimal("0.30"), output=Decimal("2.50"), reasoning=Decimal("2.50"))
KEY_ENV = "TEST_GEMINI_API_KEY"


def models(sim_url: str) -> str:
    return f"""
[[models]]
name = "{MODEL}"
type = "chat"
[models.prices]
input = "0.30"
output = "2.50"
[[models.channels]]
provider = "gemini"
base_url = "{sim_url}"
model = "{UPSTREAM}"
api_key_env = "{KEY_ENV}"

[[models]]
name = "{EMBED}"
type = "embedding"
[models.prices]
input = "0.15"
[[models.channels]]
provider = "gemini"
base_url = "{sim_url}"
model = "gemini-embedding-001"
api_key_env = "{KEY_ENV}"
"""


@pytest.fixture(scope="module")
def ggw(sim_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with gateway(tmp_path_factory.mktemp("gemini"), models(sim_url), env={KEY_ENV: "gemini-key"}) as g:
        yield g


def client(gw: Gateway, key: str) -> openai.OpenAI:
    return openai.OpenAI(api_key=key, base_url=gw.url + "/v1", max_retries=0)


def sent(sim: httpx.Client, marker: str) -> dict[str, Any]:
    entries: list[dict[str, Any]] = sim.get("/_sim/requests").json()
    (entry,) = [e for e in entries if e["path"].startswith("/v1beta/") and marker in str(e["body"])]
    return entry


def test_a_chat_request_is_said_as_generate_content(ggw: Gateway, sim: httpx.Client) -> None:
    handle = ggw.new_key(balance="5")
    marker = uuid.uuid4().hex
    with client(ggw, handle.key) as oai:
        answer = oai.chat.completions.create(
            model=MODEL,
            messages=[
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": f"{marker} [sim tokens=6 reasoning=4]"},
            ],
            max_tokens=50,
            temperature=0.5,
        )
    assert answer.choices[0].finish_reason == "stop"
    assert len((answer.choices[0].message.content or "").split()) == 6
    usage = answer.usage
    assert usage is not None and usage.completion_tokens == 6 + 4  # thinking is billed as output
    assert usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens == 4
    entry = sent(sim, marker)
    assert entry["path"] == f"/v1beta/models/{UPSTREAM}:generateContent"
    assert entry["body"]["systemInstruction"] == {"parts": [{"text": "Be brief."}]}
    assert entry["body"]["generationConfig"] == {"maxOutputTokens": 50, "temperature": 0.5}
    assert entry["body"]["contents"][0]["role"] == "user"
    charged = cost(PRICES, Usage(usage.prompt_tokens, usage.completion_tokens, reasoning_tokens=4))
    assert ggw.wait_balance(handle.account_id, Decimal(5) - charged) == Decimal(5) - charged


def test_a_stream_is_billed_exactly_thinking_included(ggw: Gateway) -> None:
    handle = ggw.new_key(balance="5")
    with client(ggw, handle.key) as oai:
        chunks = list(
            oai.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "stream [sim tokens=25 reasoning=3]"}],
                stream=True,
                stream_options={"include_usage": True},
            )
        )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 25
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 28
    assert len({c.id for c in chunks}) == 1
    charged = cost(PRICES, Usage(usage.prompt_tokens, usage.completion_tokens, reasoning_tokens=3))
    assert ggw.wait_balance(handle.account_id, Decimal(5) - charged) == Decimal(5) - charged


def test_function_calls_plain_and_streamed(ggw: Gateway, sim: httpx.Client) -> None:
    handle = ggw.new_key()
    weather: ChatCompletionToolParam = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
    marker = uuid.uuid4().hex
    with client(ggw, handle.key) as oai:
        plain = oai.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"{marker} weather?"}],
            tools=[weather],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
        )
        streamed = list(
            oai.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "weather? [sim tool]"}],
                tools=[weather],
                stream=True,
            )
        )
    assert plain.choices[0].finish_reason == "tool_calls"
    (call,) = plain.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather" and "city" in call.function.arguments  # type: ignore[union-attr]
    config = sent(sim, marker)["body"]["toolConfig"]["functionCallingConfig"]
    assert config == {"mode": "ANY", "allowedFunctionNames": ["get_weather"]}
    deltas = [c.choices[0].delta.tool_calls for c in streamed if c.choices and c.choices[0].delta.tool_calls]
    assert deltas and "city" in (deltas[0][0].function.arguments or "")  # type: ignore[union-attr]
    assert [c.choices[0].finish_reason for c in streamed if c.choices][-1] == "tool_calls"


def test_the_messages_shape_through_gemini(ggw: Gateway) -> None:
    handle = ggw.new_key()
    with anthropic.Anthropic(api_key=handle.key, base_url=ggw.url, max_retries=0) as claude:
        message = claude.messages.create(
            model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "hi [sim tokens=5]"}]
        )
        assert message.stop_reason == "end_turn" and message.usage.output_tokens == 5
        with claude.messages.stream(
            model=MODEL,
            max_tokens=64,
            messages=[{"role": "user", "content": "go [sim tokens=6 filter_after=2]"}],
        ) as stream:
            final = stream.get_final_message()
        assert final.stop_reason == "refusal" and final.usage.output_tokens == 2


def test_a_blocked_prompt_is_content_filtered_and_free(ggw: Gateway) -> None:
    handle = ggw.new_key(balance="5")
    with client(ggw, handle.key) as oai, pytest.raises(openai.BadRequestError) as caught:
        oai.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "[sim fail=content_policy]"}]
        )
    body = caught.value.body
    assert isinstance(body, dict) and body["code"] == "content_filtered"
    assert ggw.balance(handle.account_id) == Decimal(5)


def test_resource_exhausted_is_provider_overloaded(ggw: Gateway) -> None:
    handle = ggw.new_key()
    with client(ggw, handle.key) as oai, pytest.raises(openai.RateLimitError) as caught:
        oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "[sim fail=429]"}])
    body = caught.value.body
    assert isinstance(body, dict) and body["code"] == "provider_overloaded"


def test_an_invalid_key_is_the_gateways_fault(sim_url: str, tmp_path: Path) -> None:
    with gateway(tmp_path, models(sim_url), env={KEY_ENV: "invalid"}) as g:
        handle = g.new_key()
        with client(g, handle.key) as oai, pytest.raises(openai.APIStatusError) as caught:
            oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
    assert caught.value.status_code == 502
    body = caught.value.body
    assert isinstance(body, dict) and body["code"] == "provider_error"


def test_a_stream_cut_short_is_billed_for_what_was_delivered(ggw: Gateway) -> None:
    """Gemini's usage comes with its last event: a stream cut before it is billed from the gateway's
    own counts, the whole prompt and exactly the output the client was sent (spec 6.1.9)."""
    handle = ggw.new_key(balance="5")
    # Paced: a reset arriving with events still unread would discard them (see test_early_end).
    got = chat_stream(ggw, handle.key, MODEL, "cut [sim tokens=20 drop_after=6 pace=30ms]")
    assert len(got.text.split()) == 6
    assert "provider_error" in got.events[-1]
    expected = cost(PRICES, Usage(count_chat_tokens(got.body), count_tokens(got.text)))
    assert ggw.wait_balance(handle.account_id, Decimal(5) - expected) == Decimal(5) - expected


def test_embeddings_through_batch_embed_contents(ggw: Gateway, sim: httpx.Client) -> None:
    """Gemini reports no usage for embeddings: the gateway counts the input, bills it, and says it."""
    handle = ggw.new_key(balance="5")
    with client(ggw, handle.key) as oai:
        floats = oai.embeddings.create(
            model=EMBED, input=["one fish", "two fish"], dimensions=8, encoding_format="float"
        )
        packed = oai.embeddings.create(model=EMBED, input="one fish", dimensions=8)  # the SDK asks for base64
    assert [len(d.embedding) for d in floats.data] == [8, 8]
    assert packed.data[0].embedding == pytest.approx(floats.data[0].embedding)
    assert floats.usage.prompt_tokens == count_tokens("one fish") + count_tokens("two fish")
    entries: list[dict[str, Any]] = sim.get("/_sim/requests").json()
    sent = [e for e in entries if e["path"].endswith(":batchEmbedContents")][-1]["body"]["requests"][0]
    assert sent["model"] == "models/gemini-embedding-001" and sent["outputDimensionality"] == 8
    prices = Prices(input=Decimal("0.15"))
    charged = cost(prices, Usage(floats.usage.prompt_tokens)) + cost(
        prices, Usage(packed.usage.prompt_tokens)
    )
    assert ggw.wait_balance(handle.account_id, Decimal(5) - charged) == Decimal(5) - charged


def test_token_arrays_are_refused_for_gemini_embeddings(ggw: Gateway) -> None:
    handle = ggw.new_key()
    with client(ggw, handle.key) as oai, pytest.raises(openai.BadRequestError) as caught:
        oai.embeddings.create(model=EMBED, input=[[1, 2, 3]])
    body = caught.value.body
    assert isinstance(body, dict) and body["code"] == "invalid_request" and body["param"] == "input"


def test_the_responses_shape_through_gemini(ggw: Gateway) -> None:
    check_responses_shape(ggw, MODEL)

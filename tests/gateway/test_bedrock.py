"""AWS Bedrock channels (provider = "bedrock", the Converse API): SigV4-signed requests, chat
completions said as Converse and back, ConverseStream's binary event stream as chat chunks, through
the official openai and anthropic clients, billed from Bedrock's usage."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest
from openai.types.chat import ChatCompletionToolParam
from pydantic import BaseModel
from test_responses_translation import check_responses_shape

from gateway.config import ConfigError, Prices, parse_settings
from gateway.core import count_chat_tokens, count_tokens
from gateway.pricing import Usage, cost
from gateway.sim.bedrock import ACCESS_KEY_ID, SECRET_ACCESS_KEY
from harness import Gateway, chat_stream, gateway

MODEL = "bedrock/claude-3-haiku"
UPSTREAM = "anthropic.claude-3-haiku-20240307-v1:0"
PRICES = Prices(input=Decimal("0.25"), output=Decimal("1.25"))
CREDENTIALS = {"AWS_ACCESS_KEY_ID": ACCESS_KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY}


def models(sim_url: str) -> str:
    return f"""
[[models]]
name = "{MODEL}"
type = "chat"
[models.prices]
input = "0.25"
output = "1.25"
[[models.channels]]
provider = "bedrock"
base_url = "{sim_url}"
model = "{UPSTREAM}"
region = "us-west-2"
"""


@pytest.fixture(scope="module")
def bgw(sim_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with gateway(tmp_path_factory.mktemp("bedrock"), models(sim_url), env=CREDENTIALS) as g:
        yield g


def client(gw: Gateway, key: str) -> openai.OpenAI:
    return openai.OpenAI(api_key=key, base_url=gw.url + "/v1", max_retries=0)


def converse_requests(sim: httpx.Client, marker: str) -> list[dict[str, Any]]:
    entries = sim.get("/_sim/requests").json()
    return [e for e in entries if e["path"].startswith("/model/") and marker in str(e["body"])]


def test_a_chat_request_is_said_as_converse_and_answered_as_chat(bgw: Gateway, sim: httpx.Client) -> None:
    handle = bgw.new_key(balance="5")
    marker = uuid.uuid4().hex
    with client(bgw, handle.key) as oai:
        answer = oai.chat.completions.create(
            model=MODEL,
            messages=[
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": f"{marker} [sim tokens=7]"},
            ],
            max_tokens=100,
            temperature=0.2,
            stop=["END"],
        )
    assert answer.choices[0].finish_reason == "stop"
    assert answer.choices[0].message.content and len(answer.choices[0].message.content.split()) == 7
    assert answer.id.startswith("chatcmpl-") and answer.usage is not None
    assert answer.usage.completion_tokens == 7
    (sent,) = converse_requests(sim, marker)
    assert sent["path"] == f"/model/{UPSTREAM}/converse"
    assert sent["body"]["system"] == [{"text": "Be brief."}]
    assert sent["body"]["inferenceConfig"] == {"maxTokens": 100, "temperature": 0.2, "stopSequences": ["END"]}
    charged = cost(PRICES, Usage(answer.usage.prompt_tokens, answer.usage.completion_tokens))
    assert bgw.wait_balance(handle.account_id, Decimal(5) - charged) == Decimal(5) - charged


def test_a_stream_from_the_event_stream_is_billed_exactly(bgw: Gateway) -> None:
    handle = bgw.new_key(balance="5")
    with client(bgw, handle.key) as oai:
        chunks = list(
            oai.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "stream [sim tokens=30]"}],
                stream=True,
                stream_options={"include_usage": True},
            )
        )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 30
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 30
    assert len({c.id for c in chunks}) == 1
    charged = cost(PRICES, Usage(usage.prompt_tokens, usage.completion_tokens))
    assert bgw.wait_balance(handle.account_id, Decimal(5) - charged) == Decimal(5) - charged


def test_a_stream_cut_short_is_billed_for_what_was_delivered(bgw: Gateway) -> None:
    """Bedrock reports usage last: a stream cut before it is billed from the gateway's own counts,
    the whole prompt and exactly the output the client was sent (spec 6.1.9)."""
    handle = bgw.new_key(balance="5")
    # Paced: a reset arriving with events still unread would discard them (see test_early_end).
    got = chat_stream(bgw, handle.key, MODEL, "cut [sim tokens=20 drop_after=5 pace=30ms]")
    assert len(got.text.split()) == 5
    assert "provider_error" in got.events[-1]
    expected = cost(PRICES, Usage(count_chat_tokens(got.body), count_tokens(got.text)))
    assert bgw.wait_balance(handle.account_id, Decimal(5) - expected) == Decimal(5) - expected


def test_a_mid_stream_exception_ends_the_stream_with_the_shapes_error(bgw: Gateway) -> None:
    handle = bgw.new_key()
    with client(bgw, handle.key) as oai:
        stream = oai.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "err [sim tokens=9 error_after=3]"}],
            stream=True,
        )
        with pytest.raises(openai.APIError) as caught:
            for _ in stream:
                pass
    body = caught.value.body
    assert isinstance(body, dict) and body["code"] == "provider_error", body


WEATHER: ChatCompletionToolParam = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def test_tool_calls_plain_and_streamed(bgw: Gateway, sim: httpx.Client) -> None:
    handle = bgw.new_key()
    weather = WEATHER
    marker = uuid.uuid4().hex
    with client(bgw, handle.key) as oai:
        plain = oai.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"{marker} weather?"}],
            tools=[weather],
            tool_choice="required",
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
    (sent,) = converse_requests(sim, marker)
    assert sent["body"]["toolConfig"]["toolChoice"] == {"any": {}}
    assert sent["body"]["toolConfig"]["tools"][0]["toolSpec"]["inputSchema"]["json"]["required"] == ["city"]
    arguments = "".join(
        c.choices[0].delta.tool_calls[0].function.arguments or ""  # type: ignore[union-attr]
        for c in streamed
        if c.choices and c.choices[0].delta.tool_calls
    )
    assert "city" in arguments
    assert [c.choices[0].finish_reason for c in streamed if c.choices][-1] == "tool_calls"
    # As OpenAI streams an answer of tool calls only: the role with null content beside the first
    # call (verification review: content "" first, so the streamed answer's content was "").
    first = next(c.choices[0].delta for c in streamed if c.choices)
    assert first.role == "assistant" and first.content is None and first.tool_calls
    assert plain.choices[0].message.content is None


def tool_loop(marker: str, tool: str, result: str) -> list[Any]:
    """A conversation in which the model called `tool` and it answered `result`."""
    call = {"id": "call_1", "type": "function", "function": {"name": tool, "arguments": "{}"}}
    return [
        {"role": "user", "content": f"{marker} go on"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": result},
    ]


@pytest.mark.parametrize("last_turn", ["no tools", "tool_choice none"])
def test_a_tool_loop_s_prose_turn_declares_tools_converse_needs(
    bgw: Gateway, sim: httpx.Client, last_turn: str
) -> None:
    """Converse refuses toolUse/toolResult blocks without a toolConfig: a conversation that has
    them declares the tools it used (the client's own when it sends them)."""
    handle = bgw.new_key()
    marker = uuid.uuid4().hex
    history = tool_loop(marker, "get_weather", "sunny")
    extra: dict[str, Any] = {}
    if last_turn == "tool_choice none":
        extra = {"tool_choice": "none", "tools": [WEATHER]}
    with client(bgw, handle.key) as oai:
        answer = oai.chat.completions.create(model=MODEL, messages=history, **extra)
    assert answer.choices[0].finish_reason == "stop" and answer.choices[0].message.content
    (sent,) = converse_requests(sim, marker)
    (declared,) = sent["body"]["toolConfig"]["tools"]
    assert declared["toolSpec"]["name"] == "get_weather"
    assert "toolChoice" not in sent["body"]["toolConfig"]


def test_a_tool_that_returned_nothing_is_said_in_words(bgw: Gateway, sim: httpx.Client) -> None:
    """Converse refuses a blank text block: an empty tool result goes as "(no output)"."""
    handle = bgw.new_key()
    marker = uuid.uuid4().hex
    history = tool_loop(marker, "clear", "")
    with client(bgw, handle.key) as oai:
        answer = oai.chat.completions.create(model=MODEL, messages=history)
    assert answer.choices[0].message.content
    (sent,) = converse_requests(sim, marker)
    (result,) = [b["toolResult"] for m in sent["body"]["messages"] for b in m["content"] if "toolResult" in b]
    assert result["content"] == [{"text": "(no output)"}]


def test_the_messages_shape_through_bedrock(bgw: Gateway) -> None:
    handle = bgw.new_key()
    with anthropic.Anthropic(api_key=handle.key, base_url=bgw.url, max_retries=0) as claude:
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


def test_throttling_is_provider_overloaded(bgw: Gateway) -> None:
    handle = bgw.new_key()
    with client(bgw, handle.key) as oai, pytest.raises(openai.RateLimitError) as caught:
        oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "[sim fail=429]"}])
    body = caught.value.body
    assert isinstance(body, dict) and body["code"] == "provider_overloaded"


def test_throttling_inside_the_stream_before_its_first_token_is_provider_overloaded(bgw: Gateway) -> None:
    """ConverseStream can say throttlingException as its first event (after the 200): that is the
    provider at capacity, as its 429 would be, not a broken stream."""
    handle = bgw.new_key()
    before = bgw.balance(handle.account_id)
    with client(bgw, handle.key) as oai, pytest.raises(openai.RateLimitError) as caught:
        oai.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "[sim error_after=0 overloaded]"}], stream=True
        )
    body = caught.value.body
    assert isinstance(body, dict) and body["code"] == "provider_overloaded"
    assert caught.value.response.headers["retry-after"]
    assert bgw.balance(handle.account_id) == before


def test_wrong_credentials_are_the_gateways_fault(sim_url: str, tmp_path: Path) -> None:
    env = {"AWS_ACCESS_KEY_ID": ACCESS_KEY_ID, "AWS_SECRET_ACCESS_KEY": "not-the-secret"}
    with gateway(tmp_path, models(sim_url), env=env) as g:
        handle = g.new_key()
        with client(g, handle.key) as oai, pytest.raises(openai.APIStatusError) as caught:
            oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
    assert caught.value.status_code == 502
    body = caught.value.body
    assert isinstance(body, dict) and body["code"] == "provider_error"


def test_a_bedrock_channel_needs_its_region() -> None:
    channel = {"provider": "bedrock", "base_url": "https://example.com", "model": UPSTREAM}
    with pytest.raises(ConfigError, match="region: required"):
        parse_settings(
            {"models": [{"name": "bedrock/m", "type": "chat", "channels": [channel]}]}, Path("/tmp")
        )
    channel["base_url"] = "https://bedrock-runtime.eu-central-1.amazonaws.com"
    settings = parse_settings(
        {"models": [{"name": "bedrock/m", "type": "chat", "channels": [channel]}]}, Path("/tmp")
    )
    assert settings.models[0].channels[0].region == "eu-central-1"


def test_the_responses_shape_through_bedrock(bgw: Gateway) -> None:
    check_responses_shape(bgw, MODEL)


class Weather(BaseModel):
    city: str
    celsius: int


def test_structured_output_is_converse_s_output_config(bgw: Gateway, sim: httpx.Client) -> None:
    """`response_format` becomes Converse's structured output (`outputConfig.textFormat`, the schema
    as a JSON string), so the openai client's parse (and generateObject, output_type) read an
    object, plain and streamed; json_object asks for any object."""
    handle = bgw.new_key(balance="5")
    marker = uuid.uuid4().hex
    with client(bgw, handle.key) as oai:
        parsed = oai.chat.completions.parse(
            model=MODEL, messages=[{"role": "user", "content": f"{marker} weather"}], response_format=Weather
        )
        assert isinstance(parsed.choices[0].message.parsed, Weather)
        (sent,) = converse_requests(sim, marker)
        text_format = sent["body"]["outputConfig"]["textFormat"]
        assert text_format["type"] == "json_schema"
        definition = text_format["structure"]["jsonSchema"]
        assert definition["name"] == "Weather"
        assert orjson.loads(definition["schema"])["required"] == ["city", "celsius"]
        with oai.chat.completions.stream(
            model=MODEL, messages=[{"role": "user", "content": "weather"}], response_format=Weather
        ) as stream:
            assert isinstance(stream.get_final_completion().choices[0].message.parsed, Weather)
        plain = oai.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "JSON"}],
            response_format={"type": "json_object"},
        )
        assert isinstance(orjson.loads(plain.choices[0].message.content or ""), dict)

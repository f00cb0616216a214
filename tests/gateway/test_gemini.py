"""Google Gemini channels (provider = "gemini", the Generative Language API): chat completions said
as generateContent and back, streamGenerateContent's events as chat chunks, thinking billed as
output, through the official openai and anthropic clients."""

from __future__ import annotations

import re
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

from gateway.config import Prices
from gateway.core import count_chat_tokens, count_tokens
from gateway.pricing import Usage, cost
from harness import Gateway, chat_stream, gateway

MODEL = "google/gemini-2.5-flash"
EMBED = "google/gemini-embedding-001"
# Gemini 3 wants each function call's thought signature back with it (the simulator checks).
THINKING = "google/gemini-3-pro"
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
name = "{THINKING}"
type = "chat"
[models.prices]
input = "2"
output = "12"
reasoning = "20"
[[models.channels]]
provider = "gemini"
base_url = "{sim_url}"
model = "gemini-3-pro-preview"
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
    # As OpenAI streams an answer of tool calls only: the role with null content beside the first
    # call (verification review: content "" first, so the streamed answer's content was "").
    first = next(c.choices[0].delta for c in streamed if c.choices)
    assert first.role == "assistant" and first.content is None and first.tool_calls
    assert plain.choices[0].message.content is None


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


@pytest.mark.parametrize("stream", [False, True])
def test_a_blocked_prompt_is_content_filtered_free_and_not_retried(
    ggw: Gateway, sim: httpx.Client, stream: bool
) -> None:
    """Streamed, Google says it as the stream's one event (promptFeedback.blockReason): before the
    first token, so the same 400 as a plain request's, asked of the upstream once."""
    handle = ggw.new_key(balance="5")
    marker = uuid.uuid4().hex
    with client(ggw, handle.key) as oai, pytest.raises(openai.BadRequestError) as caught:
        oai.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"{marker} [sim fail=content_policy]"}],
            stream=stream,
        )
    body = caught.value.body
    assert isinstance(body, dict) and body["code"] == "content_filtered"
    assert ggw.balance(handle.account_id) == Decimal(5)
    sent(sim, marker)  # exactly one request reached the upstream


@pytest.mark.parametrize("stream", [False, True])
def test_resource_exhausted_is_provider_overloaded(ggw: Gateway, sim: httpx.Client, stream: bool) -> None:
    """Plain, Google's 429; streamed, the stream's first event is the RESOURCE_EXHAUSTED error."""
    handle = ggw.new_key()
    marker = uuid.uuid4().hex
    prompt = f"{marker} " + ("[sim error_after=0 overloaded]" if stream else "[sim fail=429]")
    with client(ggw, handle.key) as oai, pytest.raises(openai.RateLimitError) as caught:
        oai.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": prompt}], stream=stream
        )
    body = caught.value.body
    assert isinstance(body, dict) and body["code"] == "provider_overloaded"
    sent(sim, marker)


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


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
def test_reasoning_delivered_before_a_cut_is_billed_at_the_reasoning_price(ggw: Gateway, path: str) -> None:
    """Spec 6.1.9: a stream cut short is billed the output it delivered at the model's usual
    prices: its thinking at the reasoning price, as a whole stream's is (here 20 against 12 a
    million), through the chat rewriter and through the translation to the messages shape."""
    handle = ggw.new_key(balance="5")
    prompt = f"think {path} [sim tokens=10 reasoning=5 drop_after=3 pace=30ms]"
    with httpx.Client(base_url=ggw.url, headers={"authorization": f"Bearer {handle.key}"}) as http:
        body: dict[str, Any] = {
            "model": THINKING,
            "messages": [{"role": "user", "content": prompt}],
            "stream": True,
        }
        if path == "/v1/messages":
            body["max_tokens"] = 64
        with http.stream("POST", path, json=body) as answer:
            assert answer.status_code == 200
            streamed = answer.read().decode()
    rid = re.search(r'"id":"((?:chatcmpl-|msg_)[0-9a-f]+)"', streamed).group(1)  # type: ignore[union-attr]
    record = ggw.usage_record(handle.key, rid)
    assert record["status"] == "incomplete" and record["usage"]["completion_tokens"] == 3
    prices = Prices(input=Decimal(2), output=Decimal(12), reasoning=Decimal(20))
    expected = cost(prices, Usage(record["usage"]["prompt_tokens"], 3, reasoning_tokens=3))
    assert Decimal(str(record["cost"])) == expected
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


STRICT_TOOL: ChatCompletionToolParam = {
    "type": "function",
    "function": {
        "name": "roll_die",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"sides": {"$ref": "#/$defs/sides"}},
            "required": ["sides"],
            "additionalProperties": False,
            "$defs": {"sides": {"type": "integer"}},
        },
    },
}


def test_a_tool_loop_with_gemini_3_keeps_each_call_s_thought_signature(
    ggw: Gateway, sim: httpx.Client
) -> None:
    """A strict tool's JSON Schema (additionalProperties, $ref: what the Agents SDK and pydantic
    write) goes as parametersJsonSchema; the call's thought signature rides in its id, so the
    conversation sent back with the call and its result is taken, through both clients."""
    handle = ggw.new_key()
    marker = uuid.uuid4().hex
    asked = {"role": "user", "content": f"{marker} roll a die [sim tool]"}
    with client(ggw, handle.key) as oai:
        first = oai.chat.completions.create(model=THINKING, messages=[asked], tools=[STRICT_TOOL])  # type: ignore[list-item]
        (call,) = first.choices[0].message.tool_calls or []
        declared = sent(sim, marker)["body"]["tools"][0]["functionDeclarations"][0]
        assert declared["parametersJsonSchema"] == STRICT_TOOL["function"]["parameters"]
        assert "parameters" not in declared
        history: list[Any] = [
            asked,
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "4"},
        ]
        second = oai.chat.completions.create(model=THINKING, messages=history, tools=[STRICT_TOOL])
        assert second.choices[0].message.content
        streamed = "".join(
            c.choices[0].delta.content or ""
            for c in oai.chat.completions.create(
                model=THINKING,
                messages=history,
                tools=[STRICT_TOOL],
                stream=True,
            )
            if c.choices
        )
        assert streamed
        # As Google's OpenAI-compatible API has it (and the Agents SDK sends it back): the
        # signature in the call's extra_content, the id without it.
        extra = history[1]["tool_calls"][0]["extra_content"]["google"]["thought_signature"]
        assert call.id.endswith(extra.replace("+", "-").replace("/", "_").rstrip("="))
        short = call.id.partition("__thought__")[0]
        compatible: list[Any] = [
            asked,
            {**history[1], "tool_calls": [{**history[1]["tool_calls"][0], "id": short}]},
            {**history[2], "tool_call_id": short},
        ]
        assert oai.chat.completions.create(model=THINKING, messages=compatible, tools=[STRICT_TOOL]).choices
        # Without the signature (an id the gateway did not write), Gemini 3 refuses the history.
        history[1]["tool_calls"][0]["id"] = history[2]["tool_call_id"] = "call_elsewhere"
        del history[1]["tool_calls"][0]["extra_content"]
        with pytest.raises(openai.BadRequestError, match="thought_signature"):
            oai.chat.completions.create(model=THINKING, messages=history, tools=[STRICT_TOOL])
    with anthropic.Anthropic(api_key=handle.key, base_url=ggw.url, max_retries=0) as claude:
        die = {"name": "roll_die", "input_schema": STRICT_TOOL["function"]["parameters"]}
        turn = claude.messages.create(
            model=THINKING,
            max_tokens=64,
            messages=[{"role": "user", "content": "roll [sim tool]"}],
            tools=[die],  # type: ignore[list-item]
        )
        (use,) = [b for b in turn.content if b.type == "tool_use"]
        after = claude.messages.create(
            model=THINKING,
            max_tokens=64,
            tools=[die],  # type: ignore[list-item]
            messages=[
                {"role": "user", "content": "roll [sim tool]"},
                {"role": "assistant", "content": turn.content},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "4"}]},
            ],
        )
        assert after.stop_reason == "end_turn"


def test_two_identical_calls_in_one_answer_get_ids_of_their_own() -> None:
    from gateway.config import ChannelConfig
    from gateway.providers import gemini

    channel = ChannelConfig(provider="gemini", base_url="http://up", upstream_model=UPSTREAM)
    call = {"functionCall": {"name": "roll_die", "args": {}}}
    answer = {
        "candidates": [{"content": {"role": "model", "parts": [call, call]}, "finishReason": "STOP"}],
    }
    decoded = orjson.loads(gemini.decode(channel, "chat", orjson.dumps(answer), b"{}"))
    ids = [c["id"] for c in decoded["choices"][0]["message"]["tool_calls"]]
    assert len(set(ids)) == 2


class Weather(BaseModel):
    city: str
    celsius: int


def test_structured_output_is_held_to_the_schema(ggw: Gateway, sim: httpx.Client) -> None:
    """`response_format` becomes Gemini's JSON output held to the client's schema (responseJsonSchema
    whole), so the openai client's parse (and the AI SDK's generateObject, the Agents SDK's
    output_type) read an object; json_object asks for JSON without a schema."""
    handle = ggw.new_key(balance="5")
    marker = uuid.uuid4().hex
    with client(ggw, handle.key) as oai:
        parsed = oai.chat.completions.parse(
            model=MODEL, messages=[{"role": "user", "content": f"{marker} weather"}], response_format=Weather
        )
        assert isinstance(parsed.choices[0].message.parsed, Weather)
        config = sent(sim, marker)["body"]["generationConfig"]
        assert config["responseMimeType"] == "application/json"
        assert config["responseJsonSchema"] == Weather.model_json_schema() | {"additionalProperties": False}
        with oai.chat.completions.stream(
            model=MODEL, messages=[{"role": "user", "content": "weather"}], response_format=Weather
        ) as stream:
            final = stream.get_final_completion()
        assert isinstance(final.choices[0].message.parsed, Weather)
        other = uuid.uuid4().hex
        plain = oai.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"{other} JSON please"}],
            response_format={"type": "json_object"},
        )
        assert isinstance(orjson.loads(plain.choices[0].message.content or ""), dict)
        assert sent(sim, other)["body"]["generationConfig"] == {"responseMimeType": "application/json"}
        with pytest.raises(openai.BadRequestError) as refused:
            oai.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "x"}],
                response_format={"type": "json_schema", "json_schema": {"name": "x"}},
            )
        assert refused.value.body["param"] == "response_format"  # type: ignore[index]

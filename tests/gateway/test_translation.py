"""Shape translation end to end: the openai client on a messages-family model through
/v1/chat/completions, the anthropic client on a chat model through /v1/messages, plain and streamed,
with tools and images; billing from the upstream's usage; the upstream receiving its own shape."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import anthropic
import httpx
import openai
import pytest

from gateway.config import Prices
from gateway.pricing import Usage, cost
from harness import Gateway, KeyHandle, eventually, sim_requests

CLAUDE = "anthropic/claude-sonnet-4-5"
GPT = "openai/gpt-4o-mini"
LLAMA = "meta/llama-3.1-8b"
PRICES = Prices(
    input=Decimal("2.50"), cached_input=Decimal("1.25"), output=Decimal(10), reasoning=Decimal(10)
)
WEATHER_TOOL_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer"},
        "metric": {"type": "boolean"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city"],
}
OPENAI_TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The forecast for a city",
            "parameters": WEATHER_TOOL_SCHEMA,
        },
    }
]
ANTHROPIC_TOOLS: list[Any] = [
    {"name": "get_weather", "description": "The forecast for a city", "input_schema": WEATHER_TOOL_SCHEMA}
]
# A 1x1 PNG.
PNG_BASE64 = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


@pytest.fixture
def oai(gw: Gateway, key: KeyHandle) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gw.openai_base, api_key=key.key, max_retries=0) as c:
        yield c


@pytest.fixture
def claude(gw: Gateway, key: KeyHandle) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=gw.url, api_key=key.key, max_retries=0) as c:
        yield c


def marker() -> str:
    return "marker-" + os.urandom(6).hex()


def usage_record(gw: Gateway, key: KeyHandle, response_id: str) -> dict[str, Any]:
    with gw.client(key.key) as c:

        def found() -> httpx.Response | None:
            r = c.get(f"/v1/usage/{response_id}")
            return r if r.status_code == 200 else None

        r = eventually(found, step=0.05, what=f"the usage record {response_id}")
    assert r.status_code == 200, r.text
    record: dict[str, Any] = r.json()
    return record


def sse_events(body: bytes) -> list[tuple[str | None, str]]:
    events = []
    for block in body.decode().strip().split("\n\n"):
        name, data = None, ""
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                data = line.removeprefix("data: ")
        events.append((name, data))
    return events


def raw_stream(gw: Gateway, key: KeyHandle, path: str, body: dict[str, Any]) -> list[tuple[str | None, str]]:
    with gw.client(key.key) as c, c.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        return sse_events(b"".join(r.iter_bytes()))


# ---------------------------------------------------------------- the openai client on a messages model


def test_openai_client_plain_on_a_messages_model(gw: Gateway, key: KeyHandle, oai: openai.OpenAI) -> None:
    before = gw.balance(key.account_id)
    raw = oai.chat.completions.with_raw_response.create(
        model=CLAUDE,
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "Hello"}],
        max_tokens=5,
    )
    completion = raw.parse()
    assert completion.id.startswith("chatcmpl-") and completion.object == "chat.completion"
    assert completion.model == "claude-sonnet-4-5"
    choice = completion.choices[0]
    assert choice.message.role == "assistant" and len((choice.message.content or "").split()) == 5
    assert choice.finish_reason == "length"  # the upstream's max_tokens
    assert completion.usage is not None and completion.usage.completion_tokens == 5
    usage = Usage(completion.usage.prompt_tokens, completion.usage.completion_tokens)
    charged = Decimal(raw.headers["x-service-cost"])
    assert charged == cost(PRICES, usage) > 0
    assert gw.wait_balance(key.account_id, before - charged) == before - charged
    record = usage_record(gw, key, completion.id)
    assert record["model"] == CLAUDE and record["status"] == "completed"
    assert Decimal(str(record["cost"])) == charged
    assert record["usage"]["prompt_tokens"] == completion.usage.prompt_tokens


def test_openai_client_streamed_with_usage_on_a_messages_model(
    gw: Gateway, key: KeyHandle, oai: openai.OpenAI
) -> None:
    before = gw.balance(key.account_id)
    with oai.chat.completions.with_streaming_response.create(
        model=CLAUDE,
        messages=[{"role": "user", "content": "stream [sim tokens=7]"}],
        stream=True,
        stream_options={"include_usage": True},
    ) as response:
        assert "x-service-cost" not in response.headers
        chunks = list(response.parse())
    assert len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("chatcmpl-")
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 7
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        "stop"
    ]
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None and last.usage.completion_tokens == 7
    assert all(c.usage is None for c in chunks[:-1])

    record = usage_record(gw, key, last.id)
    assert record["usage"]["completion_tokens"] == 7 and record["status"] == "completed"
    assert record["usage"]["prompt_tokens"] == last.usage.prompt_tokens
    expected = cost(PRICES, Usage(last.usage.prompt_tokens, 7))
    assert Decimal(str(record["cost"])) == expected
    assert gw.wait_balance(key.account_id, before - expected) == before - expected


def test_raw_translated_chat_stream_has_no_usage_unless_asked_and_ends_with_done(
    gw: Gateway, key: KeyHandle
) -> None:
    events = raw_stream(
        gw, key, "/v1/chat/completions", {"model": CLAUDE, "messages": [{"role": "user", "content": "x"}]}
    )
    assert all(name is None for name, _ in events)
    assert events[-1] == (None, "[DONE]")
    chunks = [json.loads(data) for _, data in events[:-1]]
    assert len({c["id"] for c in chunks}) == 1
    assert all(c["choices"] and "usage" not in c for c in chunks)


def test_openai_client_tool_call_plain_on_a_messages_model(
    key: KeyHandle, oai: openai.OpenAI, sim: httpx.Client
) -> None:
    tag = marker()
    completion = oai.chat.completions.create(
        model=CLAUDE,
        messages=[{"role": "user", "content": f"weather? {tag}"}],
        tools=OPENAI_TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        parallel_tool_calls=False,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.id.startswith("toolu_")
    assert call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    assert arguments["days"] == 1 and arguments["metric"] is True and arguments["unit"] == "celsius"
    assert isinstance(arguments["city"], str) and arguments["city"]

    (received,) = sim_requests(sim, tag)
    assert received["tools"] == ANTHROPIC_TOOLS
    assert received["tool_choice"] == {
        "type": "tool",
        "name": "get_weather",
        "disable_parallel_tool_use": True,
    }


def test_openai_client_tool_call_streamed_on_a_messages_model(oai: openai.OpenAI) -> None:
    with oai.chat.completions.stream(
        model=CLAUDE,
        messages=[{"role": "user", "content": "weather in Paris? [sim tool]"}],
        tools=OPENAI_TOOLS,
        stream_options={"include_usage": True},
    ) as stream:
        deltas = [e for e in stream if e.type == "tool_calls.function.arguments.delta"]
        final = stream.get_final_completion()
    assert len(deltas) > 2  # the arguments came in fragments
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "get_weather" and call.id.startswith("toolu_")
    assert json.loads(call.function.arguments)["days"] == 1
    assert final.usage is not None and final.usage.completion_tokens > 0
    # Review: a streamed answer of tool calls only ended with content "" where the same answer
    # not streamed (and OpenAI's own stream) has null.
    plain = oai.chat.completions.create(
        model=CLAUDE,
        messages=[{"role": "user", "content": "weather in Paris? [sim tool]"}],
        tools=OPENAI_TOOLS,
    )
    assert choice.message.content == plain.choices[0].message.content


@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "streamed"])
def test_a_tool_loop_with_thinking_on_gives_the_signed_thinking_back(
    oai: openai.OpenAI, sim: httpx.Client, streamed: bool
) -> None:
    """Review (LangChain, litellm and the Agents SDK through the chat shape on Claude): the chat
    answer dropped the thinking blocks' signatures, so the tool loop's next turn reached Anthropic
    without them, which it refuses with thinking on (the simulator checks as Anthropic does: the
    turn that called the tools starts with its thinking blocks, signature and text unchanged)."""
    thinking = {"thinking": {"type": "enabled", "budget_tokens": 1024}}
    tag = marker()
    asked: list[Any] = [{"role": "user", "content": f"weather in Paris? [sim tool reasoning=4] {tag}"}]
    if streamed:
        with oai.chat.completions.stream(
            model=CLAUDE, messages=asked, tools=OPENAI_TOOLS, extra_body=thinking
        ) as stream:
            for _ in stream:
                pass
            final = stream.get_final_completion().choices[0].message
        said = final.model_dump(exclude_none=True)
    else:
        plain = oai.chat.completions.create(
            model=CLAUDE, messages=asked, tools=OPENAI_TOOLS, extra_body=thinking
        )
        said = plain.choices[0].message.model_dump(exclude_none=True)
    # `said` is the message as LiteLLM and the Agents SDK send it back.
    (block,) = said["thinking_blocks"]
    assert block["type"] == "thinking" and block["thinking"] == said["reasoning_content"]
    assert block["signature"]
    (call,) = said["tool_calls"]
    follow = [*asked, said, {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}]
    answer = oai.chat.completions.create(
        model=CLAUDE, messages=follow, tools=OPENAI_TOOLS, extra_body=thinking
    )
    assert answer.choices[0].finish_reason in ("stop", "tool_calls")
    _, second = sim_requests(sim, tag)
    assert second["messages"][1]["content"][0] == {
        "type": "thinking",
        "thinking": block["thinking"],
        "signature": block["signature"],
    }
    # Without them, Anthropic's refusal, as the model's provider gave it (the simulator's check).
    del follow[1]["thinking_blocks"]
    with pytest.raises(openai.BadRequestError, match="must start with a thinking block"):
        oai.chat.completions.create(model=CLAUDE, messages=follow, tools=OPENAI_TOOLS, extra_body=thinking)


def test_openai_client_images_and_a_tool_turn_reach_the_model_as_blocks(
    oai: openai.OpenAI, sim: httpx.Client
) -> None:
    tag = marker()
    completion = oai.chat.completions.create(
        model=CLAUDE,
        messages=[
            {"role": "developer", "content": "answer in one word"},
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": f"what is in these images? {tag}"},
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_BASE64}"}},
                    {
                        "type": "image_url",
                        "image_url": {"url": "https://example.com/cat.jpg", "detail": "low"},
                    },
                ],
            },
        ],
        tools=OPENAI_TOOLS,
        max_completion_tokens=4,
    )
    assert completion.choices[0].message.content
    (received,) = sim_requests(sim, tag)
    assert received["system"] == "answer in one word"
    assert received["max_tokens"] == 4
    assert received["messages"] == [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "call_1", "content": "sunny"},
                {"type": "text", "text": f"what is in these images? {tag}"},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": PNG_BASE64},
                },
                {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
            ],
        },
    ]


def test_messages_model_receives_its_own_shape_with_unsupported_params_dropped(
    gw: Gateway, key: KeyHandle, sim: httpx.Client
) -> None:
    tag = marker()
    body = {
        "model": CLAUDE,
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": tag}],
        "max_tokens": 5,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 7,
        "stop": "END",
        "user": "u-1",
        "seed": 3,
        "logit_bias": {"1": 2},
        "frequency_penalty": 0.1,
        "n": 1,
        "response_format": {"type": "text"},
    }
    with gw.client(key.key) as c:
        r = c.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    (received,) = sim_requests(sim, tag)
    assert received == {
        "model": "claude-sonnet-4-5",
        "messages": [{"role": "user", "content": tag}],
        "max_tokens": 5,
        "system": "be brief",
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 7,
        "stop_sequences": ["END"],
        "metadata": {"user_id": "u-1"},
    }


# ---------------------------------------------------------------- the anthropic client on a chat model


def test_anthropic_client_plain_on_a_chat_model(
    gw: Gateway, key: KeyHandle, claude: anthropic.Anthropic
) -> None:
    before = gw.balance(key.account_id)
    raw = claude.messages.with_raw_response.create(
        model=GPT, max_tokens=6, system="be brief", messages=[{"role": "user", "content": "Hello"}]
    )
    message = raw.parse()
    assert message.id.startswith("msg_") and message.type == "message" and message.role == "assistant"
    assert message.model == "gpt-4o-mini"
    (block,) = message.content
    assert block.type == "text" and len(block.text.split()) == 6
    assert message.stop_reason == "max_tokens" and message.stop_sequence is None
    assert message.usage.output_tokens == 6 and message.usage.input_tokens > 0
    assert message.usage.cache_read_input_tokens == 0
    charged = Decimal(raw.headers["x-service-cost"])
    assert charged == cost(PRICES, Usage(message.usage.input_tokens, message.usage.output_tokens))
    assert raw.headers["x-service-request-id"].startswith("req_")
    assert gw.wait_balance(key.account_id, before - charged) == before - charged
    record = usage_record(gw, key, message.id)
    assert record["model"] == GPT and Decimal(str(record["cost"])) == charged
    assert record["usage"] == {
        "prompt_tokens": message.usage.input_tokens,
        "completion_tokens": 6,
        "total_tokens": message.usage.input_tokens + 6,
    }


def test_anthropic_client_streamed_on_a_chat_model(
    gw: Gateway, key: KeyHandle, claude: anthropic.Anthropic
) -> None:
    with claude.messages.stream(
        model=GPT, max_tokens=100, messages=[{"role": "user", "content": "Stream [sim tokens=9]"}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert len(text.split()) == 9
    assert final.id.startswith("msg_") and final.stop_reason == "end_turn"
    assert final.content[0].type == "text" and final.content[0].text == text
    assert final.usage.output_tokens == 9 and final.usage.input_tokens > 0
    record = usage_record(gw, key, final.id)
    assert record["status"] == "completed"
    assert record["usage"]["completion_tokens"] == 9
    assert record["usage"]["prompt_tokens"] == final.usage.input_tokens
    assert Decimal(str(record["cost"])) == cost(PRICES, Usage(final.usage.input_tokens, 9))


def test_raw_translated_messages_stream_has_the_family_events_and_one_id(gw: Gateway, key: KeyHandle) -> None:
    events = raw_stream(
        gw,
        key,
        "/v1/messages",
        {"model": GPT, "max_tokens": 50, "messages": [{"role": "user", "content": "x [sim tokens=3]"}]},
    )
    names = [name for name, _ in events]
    assert names == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * 3,
        "content_block_stop",
        "message_delta",
        "message_stop",
        None,
    ]
    assert events[-1] == (None, "[DONE]")
    payloads = [json.loads(data) for _, data in events[:-1]]
    assert len({p["id"] for p in payloads}) == 1
    assert payloads[0]["message"]["id"] == payloads[0]["id"]
    assert [p["type"] for p in payloads] == names[:-1]


def test_anthropic_client_tool_use_plain_on_a_chat_model(
    claude: anthropic.Anthropic, sim: httpx.Client
) -> None:
    tag = marker()
    message = claude.messages.create(
        model=GPT,
        max_tokens=100,
        messages=[{"role": "user", "content": f"weather? {tag}"}],
        tools=ANTHROPIC_TOOLS,
        tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
    )
    assert message.stop_reason == "tool_use"
    (block,) = message.content
    assert block.type == "tool_use" and block.name == "get_weather" and block.id.startswith("call_")
    assert block.input == {"city": block.input["city"], "days": 1, "metric": True, "unit": "celsius"}

    (received,) = sim_requests(sim, tag)
    assert received["tools"] == OPENAI_TOOLS
    assert received["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert received["parallel_tool_calls"] is False
    assert received["max_completion_tokens"] == 100 and "max_tokens" not in received


def test_anthropic_client_tool_use_streamed_on_a_chat_model(claude: anthropic.Anthropic) -> None:
    with claude.messages.stream(
        model=GPT,
        max_tokens=100,
        messages=[{"role": "user", "content": "weather? [sim tool]"}],
        tools=ANTHROPIC_TOOLS,
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()
    assert sum(e.type == "input_json" for e in events) > 2  # the input came in fragments
    assert final.stop_reason == "tool_use"
    (block,) = final.content
    assert block.type == "tool_use" and block.name == "get_weather"
    assert block.input["days"] == 1 and block.input["metric"] is True
    assert final.usage.output_tokens > 0


def test_anthropic_client_tool_result_and_image_reach_the_chat_model_in_its_shape(
    claude: anthropic.Anthropic, sim: httpx.Client
) -> None:
    tag = marker()
    message = claude.messages.create(
        model=GPT,
        max_tokens=5,
        system=[{"type": "text", "text": "be brief"}],
        messages=[
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": [{"type": "text", "text": "sunny"}],
                    },
                    {"type": "text", "text": f"and this? {tag}"},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": PNG_BASE64},
                    },
                    {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
                ],
            },
        ],
        tools=ANTHROPIC_TOOLS,
        stop_sequences=["END"],
        metadata={"user_id": "u-2"},
        extra_body={"temperature": 0.2, "top_k": 5},  # parameters this client version no longer names
    )
    assert message.content[0].type == "text"
    (received,) = sim_requests(sim, tag)
    assert received["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": f"and this? {tag}"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_BASE64}"}},
                {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
            ],
        },
    ]
    assert received["stop"] == ["END"] and received["temperature"] == 0.2 and received["user"] == "u-2"
    assert "top_k" not in received  # not a parameter of this chat model (spec 1.3)


def test_chat_model_with_its_own_parameter_list_gets_max_tokens_and_top_k(
    gw: Gateway, key: KeyHandle, sim: httpx.Client
) -> None:
    tag = marker()
    body = {
        "model": LLAMA,
        "max_tokens": 4,
        "top_k": 3,
        "stop_sequences": ["END"],
        "messages": [{"role": "user", "content": tag}],
        "stream": True,
    }
    events = raw_stream(gw, key, "/v1/messages", body)
    assert events[-2][0] == "message_stop"
    (received,) = sim_requests(sim, tag)
    # Exactly this model's supported parameters (conftest), translated.
    assert received == {
        "model": "llama-3.1-8b",
        "messages": [{"role": "user", "content": tag}],
        "max_tokens": 4,
        "top_k": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


# ---------------------------------------------------------------- failures


def test_mid_stream_error_in_a_translated_chat_stream_ends_with_the_error_chunk(
    gw: Gateway, key: KeyHandle
) -> None:
    body = {"model": CLAUDE, "messages": [{"role": "user", "content": "x [sim tokens=8 error_after=2]"}]}
    events = raw_stream(gw, key, "/v1/chat/completions", body)
    name, data = events[-1]
    assert name is None and json.loads(data)["error"]["code"] == "provider_error"
    assert (None, "[DONE]") not in events
    chunks = [json.loads(d) for _, d in events[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks).count(" ") == 2
    record = usage_record(gw, key, chunks[0]["id"])
    assert record["status"] == "incomplete" and record["usage"]["completion_tokens"] == 2


def test_mid_stream_error_in_a_translated_messages_stream_ends_with_the_error_event(
    gw: Gateway, key: KeyHandle, claude: anthropic.Anthropic
) -> None:
    content = "x [sim tokens=8 error_after=2]"
    events = raw_stream(
        gw,
        key,
        "/v1/messages",
        {"model": GPT, "max_tokens": 50, "messages": [{"role": "user", "content": content}]},
    )
    name, data = events[-1]
    assert name == "error" and json.loads(data)["error"]["code"] == "provider_error"
    assert "message_stop" not in [n for n, _ in events]
    with (
        pytest.raises(anthropic.APIStatusError),
        claude.messages.stream(
            model=GPT, max_tokens=50, messages=[{"role": "user", "content": content}]
        ) as stream,
    ):
        for _ in stream.text_stream:
            pass


def test_upstream_failure_before_a_translated_answer_is_the_ordinary_error(
    gw: Gateway, key: KeyHandle
) -> None:
    with gw.client(key.key) as c:
        r = c.post(
            "/v1/chat/completions",
            json={"model": CLAUDE, "messages": [{"role": "user", "content": "[sim fail=429]"}]},
        )
        assert r.status_code == 429 and r.json()["error"]["code"] == "provider_overloaded"
        r = c.post(
            "/v1/messages",
            json={"model": GPT, "max_tokens": 5, "messages": [{"role": "user", "content": "[sim fail=500]"}]},
        )
        assert r.status_code == 502 and r.json()["error"]["code"] == "provider_error"


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (
            "/v1/chat/completions",
            {"model": "openai/text-embedding-3-small", "messages": [{"role": "user", "content": "x"}]},
            "model",
        ),
        (
            "/v1/messages",
            {
                "model": "openai/text-embedding-3-small",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "x"}],
            },
            "model",
        ),
        (
            "/v1/chat/completions",
            {
                "model": CLAUDE,
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}],
                    }
                ],
            },
            "messages[0].content[0]",
        ),
        (
            "/v1/chat/completions",
            {
                "model": CLAUDE,
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "ftp://x/y.png"}}],
                    }
                ],
            },
            "messages[0].content[0].image_url",
        ),
        (
            "/v1/chat/completions",
            {
                "model": CLAUDE,
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1]"}}
                        ],
                    }
                ],
            },
            "messages[0].tool_calls[0].function.arguments",
        ),
        (
            "/v1/messages",
            {
                "model": GPT,
                "max_tokens": 5,
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "document", "source": {"type": "file", "file_id": "file_011"}},
                        ],
                    }
                ],
            },
            "messages[0].content[0].source",
        ),
        (
            "/v1/messages",
            {"model": GPT, "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]},
            "messages[0].role",
        ),
    ],
)
def test_requests_that_cannot_be_translated_are_400(
    gw: Gateway, path: str, body: dict[str, Any], param: str
) -> None:
    # Too little money for any hold: the 400 comes first, as nothing is held before the translation.
    key = gw.new_key(balance="0.000001")
    with gw.client(key.key) as c:
        r = c.post(path, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "invalid_request" and r.json()["error"]["param"] == param
    assert gw.balance(key.account_id) == Decimal("0.000001")


def _dropped(gw: Gateway, response_id: str) -> list[str]:
    """The dropped parameters the request's log entry names (its tries', gateway.request_log)."""
    found: list[list[str]] = []

    def logged() -> bool:
        rows = gw.query("SELECT attempts FROM request_logs WHERE usage_id = ?", response_id)
        if rows and rows[0][0]:
            found.append(json.loads(rows[0][0])[-1].get("dropped_params", []))
        return bool(found)

    eventually(logged, 5, what=f"the log entry of {response_id}")
    return found[-1]


@pytest.mark.parametrize(
    ("path", "model", "body", "dropped"),
    [
        (
            "/v1/chat/completions",
            CLAUDE,
            {
                "messages": [{"role": "user", "content": "hi"}],
                "logit_bias": {"1": 2},
                "top_k": 3,
                "n": 1,
                "seed": 7,
            },
            ["logit_bias", "n", "seed"],
        ),
        (
            "/v1/messages",
            GPT,
            {
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 9,
                "top_k": 3,
                "service_tier": "auto",
            },
            ["service_tier", "top_k"],  # carried into the chat shape, where GPT does not take it
        ),
        (
            "/v1/responses",
            GPT,
            {"input": "hi", "include": ["x"], "truncation": "auto"},
            ["include", "truncation"],
        ),
        # Review: named by the request's own fields, not the translated ones the model did not take.
        (
            "/v1/messages",
            LLAMA,
            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 9, "metadata": {"user_id": "u"}},
            ["metadata"],
        ),
        ("/v1/responses", CLAUDE, {"input": "hi", "reasoning": {"effort": "low"}}, ["reasoning"]),
        (
            "/v1/chat/completions",
            CLAUDE,
            {"messages": [{"role": "user", "content": "hi"}], "metadata": {"a": "b"}, "user": "u"},
            ["metadata"],  # the chat request's own metadata; its user goes as the family's metadata
        ),
    ],
)
def test_what_a_translation_cannot_carry_is_logged_as_dropped(
    gw: Gateway,
    key: KeyHandle,
    sim: httpx.Client,
    path: str,
    model: str,
    body: dict[str, Any],
    dropped: list[str],
) -> None:
    """Review: a chat request to a messages model carrying logit_bias and unknown parameters was
    logged with no dropped parameters, where the same request to a chat model names them. What the
    translation leaves out is dropped (spec 1.3) and named in the log; what it carries, and the
    model takes, reaches the model (top_k, to Claude)."""
    tag = marker()
    if "messages" in body:
        body["messages"][0]["content"] += f" {tag}"
    else:
        body["input"] += f" {tag}"
    with gw.client(key.key) as c:
        r = c.post(path, json={"model": model, **body})
    assert r.status_code == 200, r.text
    assert _dropped(gw, r.json()["id"]) == dropped
    if "top_k" in body and model == CLAUDE:
        (received,) = sim_requests(sim, tag)
        assert received["top_k"] == 3 and "logit_bias" not in received

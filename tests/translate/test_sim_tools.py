"""The simulator's tool calls: when it makes one, its arguments, and each provider's wire format."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from gateway.sim.directives import parse
from gateway.sim.tools import anthropic_tool_call, arguments_for, openai_tool_call

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer"},
        "ratio": {"type": ["number", "null"]},
        "metric": {"type": "boolean"},
        "tags": {"type": "array"},
    },
}
OPENAI_TOOLS = [
    {"type": "function", "function": {"name": "first", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}},
]
ANTHROPIC_TOOLS = [
    {"type": "web_search_20250305", "name": "web_search"},
    {"name": "first", "input_schema": {"type": "object"}},
    {"name": "get_weather", "input_schema": SCHEMA},
]


def test_arguments_follow_the_schema_deterministically() -> None:
    arguments = arguments_for(SCHEMA)
    assert arguments == arguments_for(SCHEMA)
    assert isinstance(arguments.pop("city"), str)
    assert arguments == {"unit": "celsius", "days": 1, "ratio": 1, "metric": True, "tags": None}
    assert arguments_for(None) == arguments_for({"type": "object"}) == {}


@pytest.mark.parametrize(
    ("choice", "marked", "called"),
    [
        (None, False, None),
        ("auto", False, None),
        (None, True, "first"),
        ("required", False, "first"),
        ({"type": "function", "function": {"name": "get_weather"}}, False, "get_weather"),
        ({"type": "function", "function": {"name": "missing"}}, False, None),
        ("none", True, None),
    ],
)
def test_when_an_openai_request_gets_a_call(choice: Any, marked: bool, called: str | None) -> None:
    req: dict[str, Any] = {"tools": OPENAI_TOOLS}
    if choice is not None:
        req["tool_choice"] = choice
    call = openai_tool_call(req, marked, b"seed")
    assert (call.name if call else None) == called
    assert openai_tool_call({"tool_choice": "required"}, True, b"seed") is None  # no tools, no call


@pytest.mark.parametrize(
    ("choice", "marked", "called"),
    [
        (None, False, None),
        ({"type": "auto"}, False, None),
        (None, True, "first"),
        ({"type": "any"}, False, "first"),
        ({"type": "tool", "name": "get_weather"}, False, "get_weather"),
        ({"type": "none"}, True, None),
    ],
)
def test_when_an_anthropic_request_gets_a_call(choice: Any, marked: bool, called: str | None) -> None:
    req: dict[str, Any] = {"tools": ANTHROPIC_TOOLS}
    if choice is not None:
        req["tool_choice"] = choice
    call = anthropic_tool_call(req, marked, b"seed")
    assert (call.name if call else None) == called


def test_the_tool_marker_is_a_directive_without_value() -> None:
    assert parse("m", None, "weather? [sim tool tokens=3]")[1].tool
    assert not parse("m", None, "weather?")[1].tool


def chat_body(**extra: Any) -> dict[str, Any]:
    return {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "weather?"}],
        "tools": OPENAI_TOOLS,
        **extra,
    }


def test_openai_tool_call_plain(sim: httpx.Client) -> None:
    body = chat_body(tool_choice={"type": "function", "function": {"name": "get_weather"}})
    answer = sim.post("/v1/chat/completions", json=body).json()
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"])["days"] == 1
    assert answer["usage"]["completion_tokens"] > 0


def test_openai_tool_call_streamed(sim: httpx.Client) -> None:
    body = chat_body(
        messages=[{"role": "user", "content": [{"type": "text", "text": "weather? [sim tool]"}]}],
        stream=True,
        stream_options={"include_usage": True},
    )
    with sim.stream("POST", "/v1/chat/completions", json=body) as r:
        lines = [line.removeprefix("data: ") for line in r.iter_lines() if line]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(line) for line in lines[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    head = deltas[1]["tool_calls"][0]
    assert head["index"] == 0 and head["id"].startswith("call_") and head["type"] == "function"
    assert head["function"] == {"name": "first", "arguments": ""}
    fragments = [d["tool_calls"][0]["function"]["arguments"] for d in deltas[2:] if "tool_calls" in d]
    assert "".join(fragments) == "{}"
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["usage"]["completion_tokens"] > 0

    body["tool_choice"] = {"type": "function", "function": {"name": "get_weather"}}
    with sim.stream("POST", "/v1/chat/completions", json=body) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line and line != "data: [DONE]"]
    fragments = [
        d["tool_calls"][0]["function"]["arguments"]
        for c in chunks
        if c["choices"] and "tool_calls" in (d := c["choices"][0]["delta"])
    ]
    assert len(fragments) > 3  # the header's empty arguments, then several pieces
    assert json.loads("".join(fragments))["unit"] == "celsius"


def messages_body(**extra: Any) -> dict[str, Any]:
    return {
        "model": "claude-sonnet-4-5",
        "max_tokens": 50,
        "messages": [{"role": "user", "content": "weather?"}],
        "tools": ANTHROPIC_TOOLS,
        **extra,
    }


def test_anthropic_tool_use_plain(sim: httpx.Client) -> None:
    answer = sim.post(
        "/v1/messages", json=messages_body(tool_choice={"type": "tool", "name": "get_weather"})
    ).json()
    assert answer["stop_reason"] == "tool_use"
    (block,) = answer["content"]
    assert block["type"] == "tool_use" and block["id"].startswith("toolu_") and block["name"] == "get_weather"
    assert block["input"]["metric"] is True


def test_anthropic_tool_use_streamed(sim: httpx.Client) -> None:
    body = messages_body(tool_choice={"type": "any"}, stream=True, tools=ANTHROPIC_TOOLS[::-1])
    with sim.stream("POST", "/v1/messages", json=body) as r:
        text = r.read().decode()
    events = []
    for block in text.strip().split("\n\n"):
        name, data = (line.split(": ", 1)[1] for line in block.split("\n"))
        events.append((name, json.loads(data)))
    names = [name for name, _ in events]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-4:] == ["content_block_delta", "content_block_stop", "message_delta", "message_stop"]
    start = events[1][1]["content_block"]
    assert start["type"] == "tool_use" and start["name"] == "get_weather" and start["input"] == {}
    partial = [d["delta"]["partial_json"] for n, d in events if n == "content_block_delta"]
    assert all(d["delta"]["type"] == "input_json_delta" for n, d in events if n == "content_block_delta")
    assert len(partial) > 2 and json.loads("".join(partial))["days"] == 1
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"

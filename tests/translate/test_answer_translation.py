"""Whole answers between the two text shapes, stop reasons and usage."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from gateway.core import parse_chat_usage, parse_messages_usage
from gateway.pricing import Usage
from gateway.translate import chat_completion_from_message, message_from_chat_completion
from gateway.translate.stop_reasons import FINISH_REASON_FOR_STOP_REASON, finish_reason, stop_reason
from gateway.translate.usage import chat_usage, messages_usage, usage_from_chat, usage_from_messages

MESSAGE = {
    "id": "msg_gw",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-5",
    "content": [
        {"type": "thinking", "thinking": "Let me see.", "signature": "sig"},
        {"type": "text", "text": "Checking "},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
        {"type": "text", "text": "now."},
        {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}},
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {
        "input_tokens": 10,
        "cache_read_input_tokens": 5,
        "cache_creation_input_tokens": 2,
        "output_tokens": 7,
    },
}
COMPLETION = {
    "id": "chatcmpl-gw",
    "object": "chat.completion",
    "created": 1,
    "model": "gpt-4o-mini",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "Checking.",
                "reasoning_content": "Hmm.",
                "refusal": None,
                "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}},
                    {"id": "call_2", "type": "function", "function": {"name": "g", "arguments": "not json"}},
                ],
            },
            "finish_reason": "tool_calls",
        }
    ],
    "usage": {
        "prompt_tokens": 20,
        "completion_tokens": 9,
        "total_tokens": 29,
        "prompt_tokens_details": {"cached_tokens": 8},
        "completion_tokens_details": {"reasoning_tokens": 3},
    },
}


def test_message_as_a_chat_completion() -> None:
    usage = usage_from_messages(MESSAGE["usage"])  # type: ignore[arg-type]
    assert usage == Usage(prompt_tokens=17, completion_tokens=7, cached_tokens=5, cache_write_tokens=2)
    assert chat_completion_from_message(MESSAGE, usage, 123) == {
        "id": "msg_gw",
        "object": "chat.completion",
        "created": 123,
        "model": "claude-sonnet-4-5",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "Checking now.",
                    "refusal": None,
                    "reasoning_content": "Let me see.",
                    # Whole and signed, for the client to send back (LiteLLM's field).
                    "thinking_blocks": [{"type": "thinking", "thinking": "Let me see.", "signature": "sig"}],
                    "tool_calls": [
                        {
                            "id": "toolu_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                        }
                    ],
                },
                "logprobs": None,
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {
            "prompt_tokens": 17,
            "completion_tokens": 7,
            "total_tokens": 24,
            "prompt_tokens_details": {"cached_tokens": 5, "cache_write_tokens": 2},
            "completion_tokens_details": {"reasoning_tokens": 0},
        },
    }


def test_chat_completion_as_a_message() -> None:
    usage = usage_from_chat(COMPLETION["usage"])  # type: ignore[arg-type]
    assert usage == Usage(prompt_tokens=20, completion_tokens=9, cached_tokens=8, reasoning_tokens=3)
    assert message_from_chat_completion(COMPLETION, usage) == {
        "id": "chatcmpl-gw",
        "type": "message",
        "role": "assistant",
        "model": "gpt-4o-mini",
        "content": [
            {"type": "thinking", "thinking": "Hmm.", "signature": ""},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "call_1", "name": "f", "input": {"a": 1}},
            {"type": "tool_use", "id": "call_2", "name": "g", "input": {}},  # broken JSON from the model
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 12,
            "output_tokens": 9,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 8,
        },
    }


def test_only_tool_calls_mean_null_content_and_a_refusal_is_text() -> None:
    message = {"id": "m", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}
    reply = chat_completion_from_message(message, Usage(), 0)["choices"][0]["message"]
    assert reply["content"] is None and reply["tool_calls"][0]["function"]["arguments"] == "{}"
    refused = {
        "choices": [{"message": {"content": None, "refusal": "No."}, "finish_reason": "content_filter"}]
    }
    answer = message_from_chat_completion(refused, Usage())
    assert answer["content"] == [{"type": "text", "text": "No."}] and answer["stop_reason"] == "refusal"


@pytest.mark.parametrize(
    "odd", [{}, {"content": "x", "choices": "y"}, {"choices": [None]}, {"content": [None, 3]}]
)
def test_answers_of_an_unexpected_shape_do_not_fail(odd: dict[str, Any]) -> None:
    assert chat_completion_from_message(odd, Usage(), 0)["choices"][0]["finish_reason"] == "stop"
    assert message_from_chat_completion(odd, Usage())["stop_reason"] == "end_turn"


def test_stop_reasons_both_ways() -> None:
    for stop, finish in FINISH_REASON_FOR_STOP_REASON.items():
        assert finish_reason(stop) == finish
    assert [stop_reason(f) for f in ("stop", "length", "tool_calls", "content_filter", None, 3)] == [
        "end_turn",
        "max_tokens",
        "tool_use",
        "refusal",
        "end_turn",
        "end_turn",
    ]
    assert finish_reason(None) == finish_reason("something new") == "stop"
    # Review: some OpenAI-compatible servers end an answer of tool calls with "stop"; Anthropic's
    # clients continue their tool loop only on "tool_use".
    assert stop_reason("stop", called_tools=True) == stop_reason(None, called_tools=True) == "tool_use"
    assert stop_reason("length", called_tools=True) == "max_tokens"
    called = {
        "choices": [
            {"message": {"tool_calls": [{"id": "c", "function": {"name": "f"}}]}, "finish_reason": "stop"}
        ]
    }
    assert message_from_chat_completion(called, Usage())["stop_reason"] == "tool_use"


counts = st.integers(0, 10**9)


@given(counts, counts, counts, counts)
def test_usage_read_as_the_rust_core_reads_it(inputs: int, read: int, written: int, output: int) -> None:
    fields = {
        "input_tokens": inputs,
        "cache_read_input_tokens": read,
        "cache_creation_input_tokens": written,
        "output_tokens": output,
    }
    rust = parse_messages_usage(orjson.dumps({"usage": fields}))
    ours = usage_from_messages(fields)
    assert rust is not None
    assert (ours.prompt_tokens, ours.completion_tokens, ours.cached_tokens, ours.cache_write_tokens) == (
        rust.prompt_tokens,
        rust.completion_tokens,
        rust.cached_tokens,
        rust.cache_write_tokens,
    )
    chat = chat_usage(ours)
    rust_chat = parse_chat_usage(orjson.dumps({"usage": chat}))
    assert rust_chat is not None and usage_from_chat(chat) == ours
    assert (rust_chat.prompt_tokens, rust_chat.cached_tokens, rust_chat.cache_write_tokens) == (
        ours.prompt_tokens,
        ours.cached_tokens,
        ours.cache_write_tokens,
    )


@given(counts, counts, counts, counts)
def test_usage_survives_both_shapes(prompt: int, completion: int, cached: int, written: int) -> None:
    usage = Usage(
        prompt_tokens=prompt + cached + written,
        completion_tokens=completion,
        cached_tokens=cached,
        cache_write_tokens=written,
    )
    assert usage_from_messages(messages_usage(usage)) == usage
    assert usage_from_chat(chat_usage(usage)) == usage


# What orjson reads a JSON number as: a 64-bit integer (larger ones become floats).
int64s = st.integers(-(2**63), 2**63 - 1)
tool_uses = st.builds(
    lambda i, name, args: {"type": "tool_use", "id": f"toolu_{i}", "name": name, "input": args},
    st.integers(0, 99),
    st.sampled_from(["f", "g"]),
    st.dictionaries(st.text(max_size=4), int64s | st.text(max_size=4), max_size=3),
)


@given(
    st.text(max_size=20),
    st.lists(tool_uses, max_size=3),
    st.sampled_from(["end_turn", "max_tokens", "tool_use", "refusal"]),
    counts,
    counts,
)
def test_message_to_chat_and_back(
    text: str, uses: list[dict[str, Any]], stop: str, prompt: int, completion: int
) -> None:
    content = ([{"type": "text", "text": text}] if text else []) + uses
    usage = Usage(prompt_tokens=prompt, completion_tokens=completion)
    message = {
        "id": "msg_x",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": messages_usage(usage),
    }
    chat = chat_completion_from_message(message, usage, 0)
    # An answer with tool calls that ended on its own comes back as tool_use (stop_reason()).
    back = {**message, "stop_reason": "tool_use" if uses and stop == "end_turn" else stop}
    assert message_from_chat_completion(chat, usage_from_chat(chat["usage"])) == back


answer_trees = st.recursive(
    st.none()
    | st.booleans()
    | int64s
    | st.sampled_from(["", "x", "text", "thinking", "tool_use", "stop", "tool_calls"]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "choices",
                    "message",
                    "content",
                    "type",
                    "text",
                    "thinking",
                    "tool_calls",
                    "function",
                    "name",
                    "arguments",
                    "input",
                    "id",
                    "finish_reason",
                    "stop_reason",
                    "reasoning_content",
                    "refusal",
                ]
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=16,
)


@given(st.dictionaries(st.sampled_from(["id", "model", "content", "choices", "stop_reason"]), answer_trees))
@example({"content": [{"type": []}]})  # a block's type unhashable: a set's `in` raised TypeError (CI)
def test_any_upstream_answer_translates(answer: dict[str, Any]) -> None:
    orjson.dumps(chat_completion_from_message(answer, Usage(), 0))
    orjson.dumps(message_from_chat_completion(answer, Usage()))

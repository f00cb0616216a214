"""Responses to chat: the request translation, and the stream translator against the whole-answer
translation (what the openai client's stream helper assembles is the Response a plain call gets),
however the upstream's bytes are split."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_stream_translation import chat_chunks, chat_sse, counted, events, inputs, pieces, splits

from gateway.errors import GatewayError
from gateway.translate import (
    ResponsesStreamFromChat,
    chat_request_from_responses,
    response_from_chat_completion,
)
from gateway.translate.usage import usage_from_chat

REQUEST: dict[str, Any] = {"model": "gw/gpt", "input": "hi", "temperature": 0.2}


def to_responses(upstream: list[bytes]) -> tuple[bytes, ResponsesStreamFromChat]:
    translator = ResponsesStreamFromChat("resp_gw", REQUEST, counted, created_at=1_700_000_000)
    out = b"".join(translator.feed(c) for c in upstream) + translator.finish()
    return out, translator


def accumulate(out: bytes) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """What the openai client's stream helper assembles from the events (output items by their
    output_index, built from the deltas), and the final Response event's object."""
    output: dict[int, dict[str, Any]] = {}
    final: dict[str, Any] = {}
    for sequence, (_, data) in enumerate(events(out)[:-1]):
        event = json.loads(data)
        assert event["sequence_number"] == sequence and event["id"] == "resp_gw"
        kind = event["type"]
        if kind == "response.output_item.added":
            output[event["output_index"]] = json.loads(json.dumps(event["item"]))
        elif kind == "response.content_part.added":
            output[event["output_index"]]["content"].append(dict(event["part"]))
        elif kind == "response.output_text.delta":
            output[event["output_index"]]["content"][event["content_index"]]["text"] += event["delta"]
        elif kind == "response.function_call_arguments.delta":
            output[event["output_index"]]["arguments"] += event["delta"]
        elif kind == "response.reasoning_summary_part.added":
            output[event["output_index"]]["summary"].append(dict(event["part"]))
        elif kind == "response.reasoning_summary_text.delta":
            output[event["output_index"]]["summary"][event["summary_index"]]["text"] += event["delta"]
        elif kind == "response.output_item.done":
            built = output[event["output_index"]]
            done = event["item"]
            # The deltas add up to what the done item says.
            assert built.get("arguments") == done.get("arguments")
            assert [p.get("text") for p in built.get("content", [])] == [
                p.get("text") for p in done.get("content", [])
            ]
            assert built.get("summary") == done.get("summary")
            output[event["output_index"]] = done
        elif kind in ("response.completed", "response.incomplete"):
            final = event["response"]
    return [output[i] for i in sorted(output)], final


@given(
    pieces,
    pieces,
    st.lists(st.tuples(st.sampled_from(["f", "g"]), inputs), max_size=3),
    st.sampled_from(["stop", "length", "tool_calls", "content_filter"]),
    st.integers(1, 7),
    st.integers(0, 10**6),
    st.integers(0, 10**6),
)
def test_a_translated_responses_stream_adds_up_to_the_translated_answer(
    reasoning: list[str],
    text: list[str],
    calls: list[tuple[str, dict[str, Any]]],
    finish: str,
    size: int,
    prompt: int,
    completion: int,
) -> None:
    chunks, reply = chat_chunks(reasoning, text, calls, finish, size)
    usage_fields = {"prompt_tokens": prompt, "completion_tokens": completion}
    chunks += [{"choices": [], "usage": usage_fields}, "[DONE]"]
    out, translator = to_responses([chat_sse(*chunks)])
    assert translator.done and events(out)[-1] == (None, "[DONE]")
    body = {"id": "resp_gw", "model": "gpt", "choices": [{"message": reply, "finish_reason": finish}]}
    expected = response_from_chat_completion(body, usage_from_chat(usage_fields), "resp_gw", REQUEST)
    output, final = accumulate(out)
    assert output == final["output"]
    assert final == {**expected, "created_at": 1_700_000_000}
    assert final["status"] == ("incomplete" if finish in ("length", "content_filter") else "completed")
    assert translator.usage == usage_from_chat(usage_fields)


def test_the_stream_is_the_same_however_the_upstream_is_split() -> None:
    chunks, _ = chat_chunks(["thinking"], ["Hel", "lo"], [("f", {"a": 1})], "tool_calls", 3)
    stream = chat_sse(*chunks, "[DONE]")
    whole, _ = to_responses([stream])

    @given(st.lists(st.integers(min_value=0), max_size=12))
    def check(cuts: list[int]) -> None:
        split, translator = to_responses(splits(stream, cuts))
        assert split == whole and translator.done

    check()


def test_an_upstream_error_chunk_is_kept_back_and_nothing_completes() -> None:
    error = {"error": {"message": "boom", "type": "server_error"}}
    out, translator = to_responses(
        [chat_sse({"choices": [{"index": 0, "delta": {"content": "Hi"}}]}, json.dumps(error))]
    )
    assert translator.error is not None and json.loads(translator.error) == error
    names = [name for name, _ in events(out)]
    assert names[-1] == "response.output_text.delta" and "response.completed" not in names
    assert translator.output_text == "Hi" and not translator.done


def test_no_usage_upstream_is_the_gateways_count() -> None:
    out, _ = to_responses([chat_sse({"choices": [{"index": 0, "delta": {"content": "Hi"}}]}, "[DONE]")])
    _, final = accumulate(out)
    assert final["usage"]["input_tokens"] == 111 and final["usage"]["output_tokens"] == 222


def test_interleaved_tool_calls_are_each_their_own_item() -> None:
    def call(index: int, **function: str) -> dict[str, Any]:
        head: dict[str, Any] = {"index": index, "function": function}
        if "name" in function:
            head["id"] = f"call_{index}"
        return {"choices": [{"index": 0, "delta": {"tool_calls": [head]}}]}

    out, _ = to_responses(
        [
            chat_sse(
                call(0, name="a", arguments='{"x"'),
                call(1, name="b", arguments='{"y"'),
                call(0, arguments=": 1}"),
                call(1, arguments=": 2}"),
                {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
                "[DONE]",
            )
        ]
    )
    output, final = accumulate(out)
    assert [(i["name"], json.loads(i["arguments"])) for i in output] == [("a", {"x": 1}), ("b", {"y": 2})]
    assert final["output"] == output and final["status"] == "completed"


# ---------------------------------------------------------------- the request


def test_items_become_chat_messages() -> None:
    request = chat_request_from_responses(
        {
            "model": "m",
            "instructions": "Be brief.",
            "input": [
                {
                    "type": "message",
                    "role": "developer",
                    "content": [{"type": "input_text", "text": "Rules."}],
                },
                {"role": "user", "content": "Weather?"},
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
                {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}"},
                {"type": "function_call", "call_id": "c2", "name": "w", "arguments": '{"d":1}'},
                {"type": "function_call_output", "call_id": "c1", "output": "sun"},
                {
                    "type": "function_call_output",
                    "call_id": "c2",
                    "output": [{"type": "input_text", "text": "rain"}],
                },
            ],
            "max_output_tokens": 99,
            "reasoning": {"effort": "low", "summary": "auto"},
            "text": {"format": {"type": "json_object"}, "verbosity": "low"},
            "tools": [{"type": "function", "name": "w", "parameters": {"type": "object"}, "strict": True}],
            "tool_choice": "required",
            "store": True,
            "include": ["reasoning.encrypted_content"],
            "stream": True,
        },
        "max_completion_tokens",
    )
    assert request == {
        "model": "m",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "system", "content": "Rules."},
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": "Checking.",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{}"}},
                    {"id": "c2", "type": "function", "function": {"name": "w", "arguments": '{"d":1}'}},
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "sun"},
            {"role": "tool", "tool_call_id": "c2", "content": "rain"},
        ],
        "max_completion_tokens": 99,
        "stream": True,
        "stream_options": {"include_usage": True},
        "reasoning_effort": "low",
        "response_format": {"type": "json_object"},
        "verbosity": "low",
        "tools": [
            {"type": "function", "function": {"name": "w", "parameters": {"type": "object"}, "strict": True}}
        ],
        "tool_choice": "required",
    }


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        ({"instructions": 5, "input": "x"}, "instructions"),
        ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input[0]"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input[0]"),
        ({"input": [{"role": "user", "content": 5}]}, "input[0].content"),
        (
            {"input": [{"role": "assistant", "content": [{"type": "input_image", "image_url": "u"}]}]},
            "input[0].content[0]",
        ),
        ({"input": "x", "text": "json"}, "text"),
        ({"input": "x", "tools": {}}, "tools"),
        ({"input": "x", "tools": [{"type": "function"}]}, "tools[0].name"),
    ],
)
def test_what_cannot_be_said_is_refused_naming_it(payload: dict[str, Any], param: str) -> None:
    with pytest.raises(GatewayError) as caught:
        chat_request_from_responses({"model": "m", **payload}, "max_tokens")
    assert caught.value.code == "invalid_request" and caught.value.param == param


@pytest.mark.parametrize("stream", [True, False])
def test_a_call_without_arguments_is_the_empty_object_and_a_cut_call_is_incomplete(stream: bool) -> None:
    """Stream review: a chat upstream's tool call without argument fragments (zero-argument tools
    on vLLM, Ollama) reached Responses clients as `"arguments": ""`, which the openai client's
    helper cannot parse; and a call cut by the token limit was `completed`, its JSON broken."""
    bare = {"index": 0, "id": "a", "type": "function", "function": {"name": "now", "arguments": ""}}
    cut = {
        "index": 1,
        "id": "b",
        "type": "function",
        "function": {"name": "weather", "arguments": '{"city":"Pa'},
    }
    if stream:
        out, _ = to_responses(
            [
                chat_sse(
                    {"choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": [bare]}}]},
                    {"choices": [{"index": 0, "delta": {"tool_calls": [cut]}}]},
                    {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
                    "[DONE]",
                )
            ]
        )
        output, final = accumulate(out)
        assert output == final["output"]
    else:
        reply = {"role": "assistant", "content": None, "tool_calls": [bare, cut]}
        body = {"id": "x", "model": "gpt", "choices": [{"message": reply, "finish_reason": "length"}]}
        final = response_from_chat_completion(body, usage_from_chat({}), "resp_gw", REQUEST)
    calls = [(i["arguments"], i["status"]) for i in final["output"] if i["type"] == "function_call"]
    assert calls == [("{}", "completed"), ('{"city":"Pa', "incomplete")]
    assert final["status"] == "incomplete"

"""The two stream translators: the events each client library expects, ids, usage, errors, any
byte-splitting of the upstream stream, and agreement with the whole-answer translation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from gateway.core import EMPTY_STREAM_ERROR, MALFORMED_EVENT_ERROR, SseParser
from gateway.pricing import Usage
from gateway.translate import (
    ChatStreamFromMessages,
    MessagesStreamFromChat,
    chat_completion_from_message,
    message_from_chat_completion,
)
from gateway.translate.usage import usage_from_chat, usage_from_messages

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sse"
ANTHROPIC_FIXTURE = (FIXTURES / "anthropic_messages_stream.txt").read_bytes()
OPENAI_FIXTURE = (FIXTURES / "openai_chat_stream.txt").read_bytes()
COUNTED = Usage(prompt_tokens=111, completion_tokens=222)


def counted(_: str) -> Usage:
    return COUNTED


def events(out: bytes) -> list[tuple[str | None, str]]:
    parser = SseParser()
    return [(e.event, e.data) for e in [*parser.feed(out), *parser.finish()]]


def anthropic_sse(*items: tuple[str, dict[str, Any]]) -> bytes:
    return b"".join(
        b"event: " + name.encode() + b"\ndata: " + orjson.dumps({"type": name, **data}) + b"\n\n"
        for name, data in items
    )


def chat_sse(*chunks: dict[str, Any] | str) -> bytes:
    return b"".join(
        b"data: "
        + (c.encode() if isinstance(c, str) else orjson.dumps({"id": "up", "model": "gpt", **c}))
        + b"\n\n"
        for c in chunks
    )


def to_chat(upstream: list[bytes], include_usage: bool = False) -> tuple[bytes, ChatStreamFromMessages]:
    translator = ChatStreamFromMessages("chatcmpl-gw", include_usage, 42, counted)
    out = b"".join(translator.feed(c) for c in upstream) + translator.finish()
    return out, translator


def to_messages(upstream: list[bytes]) -> tuple[bytes, MessagesStreamFromChat]:
    translator = MessagesStreamFromChat("msg_gw", counted)
    out = b"".join(translator.feed(c) for c in upstream) + translator.finish()
    return out, translator


def splits(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted(c % (len(data) + 1) for c in cuts)
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


# ---------------------------------------------------------------- messages upstream, chat client


def test_chat_stream_from_the_anthropic_fixture() -> None:
    out, translator = to_chat([ANTHROPIC_FIXTURE])
    got = events(out)
    assert all(name is None for name, _ in got) and got[-1] == (None, "[DONE]")
    chunks = [json.loads(data) for _, data in got[:-1]]
    assert {(c["id"], c["object"], c["created"], c["model"]) for c in chunks} == {
        ("chatcmpl-gw", "chat.completion.chunk", 42, "claude-sonnet-4-5")
    }
    assert [c["choices"][0]["delta"] for c in chunks] == [
        {"role": "assistant", "content": ""},
        {"content": "Hello"},
        {"content": "!"},
        {},
    ]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, None, "stop"]
    assert translator.done and translator.saw_output and translator.error is None
    assert translator.output_text == "Hello!"
    assert translator.usage == Usage(prompt_tokens=25, completion_tokens=15)


def test_usage_chunk_only_when_the_client_asked() -> None:
    out, _ = to_chat([ANTHROPIC_FIXTURE], include_usage=True)
    got = events(out)
    usage_chunk = json.loads(got[-2][1])
    assert usage_chunk["choices"] == [] and usage_chunk["id"] == "chatcmpl-gw"
    assert usage_chunk["usage"] == {
        "prompt_tokens": 25,
        "completion_tokens": 15,
        "total_tokens": 40,
        "prompt_tokens_details": {"cached_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0},
    }
    assert b"prompt_tokens" not in to_chat([ANTHROPIC_FIXTURE])[0]


TOOL_STREAM = anthropic_sse(
    (
        "message_start",
        {"message": {"id": "msg_up", "model": "claude", "usage": {"input_tokens": 9, "output_tokens": 1}}},
    ),
    ("content_block_start", {"index": 0, "content_block": {"type": "thinking", "thinking": ""}}),
    ("content_block_delta", {"index": 0, "delta": {"type": "thinking_delta", "thinking": "Hmm."}}),
    ("content_block_delta", {"index": 0, "delta": {"type": "signature_delta", "signature": "sig"}}),
    ("content_block_stop", {"index": 0}),
    ("content_block_start", {"index": 1, "content_block": {"type": "text", "text": ""}}),
    ("ping", {}),
    ("content_block_delta", {"index": 1, "delta": {"type": "text_delta", "text": "Checking."}}),
    ("content_block_stop", {"index": 1}),
    (
        "content_block_start",
        {"index": 2, "content_block": {"type": "tool_use", "id": "toolu_a", "name": "f", "input": {}}},
    ),
    ("content_block_delta", {"index": 2, "delta": {"type": "input_json_delta", "partial_json": ""}}),
    ("content_block_delta", {"index": 2, "delta": {"type": "input_json_delta", "partial_json": '{"city": '}}),
    ("content_block_delta", {"index": 2, "delta": {"type": "input_json_delta", "partial_json": '"Paris"}'}}),
    ("content_block_stop", {"index": 2}),
    (
        "content_block_start",
        {"index": 3, "content_block": {"type": "tool_use", "id": "toolu_b", "name": "g", "input": {}}},
    ),
    ("content_block_stop", {"index": 3}),
    (
        "message_delta",
        {"delta": {"stop_reason": "tool_use", "stop_sequence": None}, "usage": {"output_tokens": 30}},
    ),
    ("message_stop", {}),
)


def test_tool_use_blocks_become_tool_call_deltas() -> None:
    out, translator = to_chat([TOOL_STREAM], include_usage=True)
    chunks = [json.loads(data) for _, data in events(out)[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert deltas == [
        {"role": "assistant", "content": None},  # it begins with thinking, not text
        {"reasoning_content": "Hmm."},
        # The signed block, whole, once it ends: the client gives it back with the tool results.
        {"thinking_blocks": [{"index": 0, "type": "thinking", "thinking": "Hmm.", "signature": "sig"}]},
        {"content": "Checking."},
        {
            "tool_calls": [
                {"index": 0, "id": "toolu_a", "type": "function", "function": {"name": "f", "arguments": ""}}
            ]
        },
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]},
        {
            "tool_calls": [
                {"index": 1, "id": "toolu_b", "type": "function", "function": {"name": "g", "arguments": ""}}
            ]
        },
        {"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]},  # a call without arguments
        {},
    ]
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["usage"]["completion_tokens"] == 30 and chunks[-1]["usage"]["prompt_tokens"] == 9
    assert translator.output_text == 'Hmm.Checking.f{"city": "Paris"}g'  # the added {} is not the model's


def test_thinking_blocks_go_out_whole_when_signed_or_redacted() -> None:
    """Each in its own `thinking_blocks` entry, numbered: a redacted block, a signed one across
    deltas; a thinking block that got no signature cannot be sent back, so it is not offered."""
    stream = anthropic_sse(
        ("message_start", {"message": {"usage": {"input_tokens": 1}}}),
        ("content_block_start", {"index": 0, "content_block": {"type": "redacted_thinking", "data": "xyz"}}),
        ("content_block_stop", {"index": 0}),
        (
            "content_block_start",
            {"index": 1, "content_block": {"type": "thinking", "thinking": "", "signature": ""}},
        ),
        ("content_block_delta", {"index": 1, "delta": {"type": "thinking_delta", "thinking": "a "}}),
        ("content_block_delta", {"index": 1, "delta": {"type": "thinking_delta", "thinking": "b"}}),
        ("content_block_delta", {"index": 1, "delta": {"type": "signature_delta", "signature": "s1"}}),
        ("content_block_stop", {"index": 1}),
        ("content_block_start", {"index": 2, "content_block": {"type": "thinking", "thinking": "c"}}),
        ("content_block_stop", {"index": 2}),
        ("message_stop", {}),
    )
    out, _ = to_chat([stream])
    deltas = [json.loads(d)["choices"][0]["delta"] for _, d in events(out)[:-1]]
    assert [d["thinking_blocks"] for d in deltas if "thinking_blocks" in d] == [
        [{"index": 0, "type": "redacted_thinking", "data": "xyz"}],
        [{"index": 1, "type": "thinking", "thinking": "a b", "signature": "s1"}],
    ]
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == "a bc"


def test_a_whole_input_at_the_block_start_is_sent_as_the_arguments() -> None:
    stream = anthropic_sse(
        ("message_start", {"message": {"usage": {"input_tokens": 1}}}),
        (
            "content_block_start",
            {"index": 0, "content_block": {"type": "tool_use", "id": "t", "name": "f", "input": {"a": 1}}},
        ),
        ("content_block_stop", {"index": 0}),
        ("message_stop", {}),
    )
    out, _ = to_chat([stream])
    deltas = [json.loads(d)["choices"][0]["delta"] for _, d in events(out)[:-1]]
    # As OpenAI streams an answer of tool calls only: the role with null content and the first call.
    assert deltas[0]["role"] == "assistant" and deltas[0]["content"] is None
    assert deltas[0]["tool_calls"][0]["function"]["arguments"] == '{"a":1}'
    assert len(deltas) == 2  # the role with the call, finish: nothing added at the block's stop


def test_the_role_chunk_says_empty_content_for_text_and_for_an_empty_answer() -> None:
    for blocks, first in [
        ((("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),), ""),
        ((), ""),
    ]:
        stream = anthropic_sse(
            ("message_start", {"message": {"usage": {"input_tokens": 1}}}), *blocks, ("message_stop", {})
        )
        out, _ = to_chat([stream])
        deltas = [json.loads(d)["choices"][0]["delta"] for _, d in events(out)[:-1]]
        assert deltas[0] == {"role": "assistant", "content": first}
        assert sum("role" in d for d in deltas) == 1


def test_an_upstream_error_event_is_kept_back() -> None:
    error = anthropic_sse(("error", {"error": {"type": "overloaded_error", "message": "x"}}))
    head = ANTHROPIC_FIXTURE.split(b"event: content_block_stop")[0]
    out, translator = to_chat([head + error + ANTHROPIC_FIXTURE])
    assert translator.error == orjson.dumps(
        {"type": "error", "error": {"type": "overloaded_error", "message": "x"}}
    )
    assert b"overloaded" not in out and not translator.done
    assert [json.loads(d)["choices"][0]["delta"] for _, d in events(out)][-1] == {"content": "!"}


def test_usage_missing_upstream_is_the_gateways_count() -> None:
    stream = anthropic_sse(
        ("message_start", {"message": {"model": "m"}}),
        ("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "hi"}}),
        ("message_stop", {}),
    )
    out, translator = to_chat([stream], include_usage=True)
    assert translator.usage is None
    assert json.loads(events(out)[-2][1])["usage"]["completion_tokens"] == 222


@given(st.lists(st.integers(min_value=0), max_size=12), st.booleans())
def test_chat_stream_is_the_same_however_the_upstream_is_split(cuts: list[int], include_usage: bool) -> None:
    whole, _ = to_chat([TOOL_STREAM], include_usage)
    split, translator = to_chat(splits(TOOL_STREAM, cuts), include_usage)
    assert split == whole and translator.done


# ---------------------------------------------------------------- chat upstream, messages client


def test_messages_stream_from_the_openai_fixture() -> None:
    out, translator = to_messages([OPENAI_FIXTURE])
    got = events(out)
    assert got[-1] == (None, "[DONE]")
    payloads = [json.loads(data) for _, data in got[:-1]]
    names = [name for name, _ in got[:-1]]
    assert names == [p["type"] for p in payloads]
    assert names[:2] == ["message_start", "content_block_start"] and names[-3:] == [
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert {p["id"] for p in payloads} == {"msg_gw"} and payloads[0]["message"]["id"] == "msg_gw"
    assert payloads[0]["message"]["model"] == "gpt-4o-mini-2024-07-18"
    text = "".join(p["delta"]["text"] for p in payloads if p["type"] == "content_block_delta")
    assert text == "Hello! How can I help you today?" == translator.output_text
    assert payloads[-2]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert payloads[-2]["usage"] == {
        "input_tokens": 9,
        "output_tokens": 9,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }
    assert translator.usage == Usage(prompt_tokens=9, completion_tokens=9)
    assert translator.done and translator.saw_output and translator.error is None


CHAT_TOOL_STREAM = chat_sse(
    {"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]},
    {"choices": [{"index": 0, "delta": {"reasoning_content": "Hmm."}}]},
    {"choices": [{"index": 0, "delta": {"content": "Checking."}}]},
    {
        "choices": [
            {
                "index": 0,
                "delta": {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_a",
                            "type": "function",
                            "function": {"name": "f", "arguments": ""},
                        }
                    ]
                },
            }
        ]
    },
    {
        "choices": [
            {"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]}}
        ]
    },
    {
        "choices": [
            {"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}}
        ]
    },
    {
        "choices": [
            {
                "index": 0,
                "delta": {
                    "tool_calls": [
                        {
                            "index": 1,
                            "id": "call_b",
                            "type": "function",
                            "function": {"name": "g", "arguments": "{}"},
                        }
                    ]
                },
            }
        ]
    },
    {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    {
        "choices": [],
        "usage": {
            "prompt_tokens": 12,
            "completion_tokens": 20,
            "prompt_tokens_details": {"cached_tokens": 2},
        },
    },
    "[DONE]",
)


def test_tool_call_deltas_become_tool_use_blocks() -> None:
    out, translator = to_messages([CHAT_TOOL_STREAM])
    payloads = [json.loads(data) for _, data in events(out)[:-1]]
    assert [(p["type"], p.get("index")) for p in payloads] == [
        ("message_start", None),
        ("content_block_start", 0),
        ("content_block_delta", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_delta", 1),
        ("content_block_stop", 1),
        ("content_block_start", 2),
        ("content_block_delta", 2),
        ("content_block_delta", 2),
        ("content_block_stop", 2),
        ("content_block_start", 3),
        ("content_block_delta", 3),
        ("content_block_stop", 3),
        ("message_delta", None),
        ("message_stop", None),
    ]
    starts = [p["content_block"] for p in payloads if p["type"] == "content_block_start"]
    assert starts == [
        {"type": "thinking", "thinking": "", "signature": ""},
        {"type": "text", "text": ""},
        {"type": "tool_use", "id": "call_a", "name": "f", "input": {}},
        {"type": "tool_use", "id": "call_b", "name": "g", "input": {}},
    ]
    deltas = [p["delta"] for p in payloads if p["type"] == "content_block_delta"]
    assert deltas == [
        {"type": "thinking_delta", "thinking": "Hmm."},
        {"type": "text_delta", "text": "Checking."},
        {"type": "input_json_delta", "partial_json": '{"city":'},
        {"type": "input_json_delta", "partial_json": '"Paris"}'},
        {"type": "input_json_delta", "partial_json": "{}"},
    ]
    assert payloads[-2]["delta"]["stop_reason"] == "tool_use"
    assert payloads[-2]["usage"] == {
        "input_tokens": 10,
        "output_tokens": 20,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 2,
    }
    assert translator.usage == Usage(prompt_tokens=12, completion_tokens=20, cached_tokens=2)


def test_tool_calls_that_end_with_stop_end_with_tool_use() -> None:
    """Some OpenAI-compatible servers (vLLM, Ollama builds) end an answer of tool calls with "stop"."""
    stream = CHAT_TOOL_STREAM.replace(b'"finish_reason":"tool_calls"', b'"finish_reason":"stop"')
    assert stream != CHAT_TOOL_STREAM
    out, _ = to_messages([stream])
    payloads = [json.loads(data) for _, data in events(out)[:-1]]
    assert payloads[-2]["delta"]["stop_reason"] == "tool_use"


def test_an_upstream_error_chunk_is_kept_back() -> None:
    error = b'data: {"error":{"message":"boom","type":"server_error"}}\n\n'
    head = chat_sse({"choices": [{"index": 0, "delta": {"content": "a"}}]})
    out, translator = to_messages([head + error + OPENAI_FIXTURE])
    assert translator.error == b'{"error":{"message":"boom","type":"server_error"}}'
    assert b"boom" not in out and not translator.done
    assert [name for name, _ in events(out)] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
    ]


def test_interleaved_tool_calls_end_the_stream_as_an_upstream_error() -> None:
    call = {"type": "function", "function": {"name": "f", "arguments": "{"}}
    stream = chat_sse(
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "a", **call}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 1, "id": "b", **call}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]}}]},
    )
    _, translator = to_messages([stream])
    assert translator.error is not None and not translator.done


def test_a_stream_ending_after_its_finish_chunk_without_done_is_complete() -> None:
    stream = chat_sse(
        {"choices": [{"index": 0, "delta": {"content": "hi"}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
    )
    out, translator = to_messages([stream])
    assert translator.done and events(out)[-1] == (None, "[DONE]")
    delta = json.loads(events(out)[-3][1])
    assert delta["delta"]["stop_reason"] == "max_tokens"
    assert delta["usage"]["output_tokens"] == 222  # no usage upstream: the gateway's count
    _, unfinished = to_messages([chat_sse({"choices": [{"index": 0, "delta": {"content": "hi"}}]})])
    assert not unfinished.done


@given(st.lists(st.integers(min_value=0), max_size=12))
def test_messages_stream_is_the_same_however_the_upstream_is_split(cuts: list[int]) -> None:
    whole, _ = to_messages([CHAT_TOOL_STREAM])
    split, translator = to_messages(splits(CHAT_TOOL_STREAM, cuts))
    assert split == whole and translator.done


# ---------------------------------------------------------------- a stream says what the whole answer says

pieces = st.lists(st.text(min_size=1, max_size=6), max_size=4)
int64s = st.integers(-(2**63), 2**63 - 1)
inputs = st.dictionaries(st.text(max_size=4), int64s | st.text(max_size=4) | st.booleans(), max_size=3)
counts = st.integers(0, 10**6)


def fragments(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


@given(
    pieces,
    pieces,
    st.lists(st.tuples(st.sampled_from(["f", "g"]), inputs), max_size=3),
    st.sampled_from(["end_turn", "max_tokens", "tool_use", "stop_sequence"]),
    st.integers(1, 7),
    counts,
    counts,
)
def test_a_translated_chat_stream_adds_up_to_the_translated_answer(
    thinking: list[str],
    text: list[str],
    uses: list[tuple[str, dict[str, Any]]],
    stop: str,
    size: int,
    prompt: int,
    output: int,
) -> None:
    blocks: list[dict[str, Any]] = []
    stream: list[tuple[str, dict[str, Any]]] = [
        (
            "message_start",
            {
                "message": {
                    "id": "m",
                    "model": "claude",
                    "usage": {"input_tokens": prompt, "output_tokens": 1},
                }
            },
        )
    ]

    def block(start: dict[str, Any], deltas: list[dict[str, Any]], whole: dict[str, Any]) -> None:
        index = len(blocks)
        blocks.append(whole)
        stream.append(("content_block_start", {"index": index, "content_block": start}))
        stream.extend(("content_block_delta", {"index": index, "delta": d}) for d in deltas)
        stream.append(("content_block_stop", {"index": index}))

    if thinking:
        deltas = [{"type": "thinking_delta", "thinking": t} for t in thinking]
        block(
            {"type": "thinking", "thinking": ""}, deltas, {"type": "thinking", "thinking": "".join(thinking)}
        )
    if text:
        block(
            {"type": "text", "text": ""},
            [{"type": "text_delta", "text": t} for t in text],
            {"type": "text", "text": "".join(text)},
        )
    for i, (name, tool_input) in enumerate(uses):
        deltas = [
            {"type": "input_json_delta", "partial_json": f}
            for f in fragments(orjson.dumps(tool_input).decode(), size)
        ]
        start = {"type": "tool_use", "id": f"toolu_{i}", "name": name, "input": {}}
        block(start, deltas, {**start, "input": tool_input})
    stream.append(("message_delta", {"delta": {"stop_reason": stop}, "usage": {"output_tokens": output}}))
    stream.append(("message_stop", {}))
    message = {"id": "chatcmpl-gw", "model": "claude", "content": blocks, "stop_reason": stop}
    usage = usage_from_messages({"input_tokens": prompt, "output_tokens": output})

    out, _ = to_chat([anthropic_sse(*stream)], include_usage=True)
    expected = chat_completion_from_message(message, usage, 42)
    assert accumulate_chat(out) == {
        "content": expected["choices"][0]["message"]["content"] or "",
        "reasoning_content": expected["choices"][0]["message"].get("reasoning_content", ""),
        "tool_calls": expected["choices"][0]["message"].get("tool_calls", []),
        "finish_reason": expected["choices"][0]["finish_reason"],
        "usage": expected["usage"],
    }


def accumulate_chat(out: bytes) -> dict[str, Any]:
    """What the openai client's stream helper assembles from chunks."""
    result: dict[str, Any] = {"content": "", "reasoning_content": "", "tool_calls": [], "finish_reason": None}
    for _, data in events(out)[:-1]:
        chunk = json.loads(data)
        if not chunk["choices"]:
            result["usage"] = chunk["usage"]
            continue
        choice = chunk["choices"][0]
        delta = choice["delta"]
        result["content"] += delta.get("content") or ""
        result["reasoning_content"] += delta.get("reasoning_content", "")
        for call in delta.get("tool_calls", []):
            if call["index"] == len(result["tool_calls"]):
                result["tool_calls"].append({**call, "function": dict(call["function"])})
                del result["tool_calls"][-1]["index"]
            else:
                result["tool_calls"][call["index"]]["function"]["arguments"] += call["function"]["arguments"]
        result["finish_reason"] = choice["finish_reason"] or result["finish_reason"]
    for call in result["tool_calls"]:  # the same object, however its JSON was spaced
        call["function"]["arguments"] = orjson.dumps(json.loads(call["function"]["arguments"])).decode()
    return result


@given(
    pieces,
    pieces,
    st.lists(st.tuples(st.sampled_from(["f", "g"]), inputs), max_size=3),
    st.sampled_from(["stop", "length", "tool_calls", "content_filter"]),
    st.integers(1, 7),
    counts,
    counts,
)
def test_a_translated_messages_stream_adds_up_to_the_translated_answer(
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
    completion_body = {
        "id": "msg_gw",
        "model": "gpt",
        "choices": [{"message": reply, "finish_reason": finish}],
    }

    out, _ = to_messages([chat_sse(*chunks)])
    expected = message_from_chat_completion(completion_body, usage_from_chat(usage_fields))
    assert accumulate_message(out) == expected


def chat_chunks(
    reasoning: list[str], text: list[str], calls: list[tuple[str, dict[str, Any]]], finish: str, size: int
) -> tuple[list[dict[str, Any] | str], dict[str, Any]]:
    """A chat stream, and the whole chat message it adds up to."""
    chunks: list[dict[str, Any] | str] = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    ]
    chunks += [{"choices": [{"index": 0, "delta": {"reasoning_content": r}}]} for r in reasoning]
    chunks += [{"choices": [{"index": 0, "delta": {"content": t}}]} for t in text]
    tool_calls = []
    for i, (name, arguments) in enumerate(calls):
        whole: dict[str, Any] = {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": name, "arguments": orjson.dumps(arguments).decode()},
        }
        tool_calls.append(whole)
        head = {
            "index": i,
            "id": whole["id"],
            "type": "function",
            "function": {"name": name, "arguments": ""},
        }
        chunks.append({"choices": [{"index": 0, "delta": {"tool_calls": [head]}}]})
        chunks += [
            {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": i, "function": {"arguments": f}}]}}]}
            for f in fragments(whole["function"]["arguments"], size)
        ]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    reply: dict[str, Any] = {"content": "".join(text), "tool_calls": tool_calls}
    if reasoning:
        reply["reasoning_content"] = "".join(reasoning)
    return chunks, reply


def accumulate_message(out: bytes) -> dict[str, Any]:
    """What the anthropic client's stream helper assembles from events."""
    message: dict[str, Any] = {}
    partial: dict[int, str] = {}
    for name, data in events(out)[:-1]:
        event = json.loads(data)
        if name == "message_start":
            message = {k: v for k, v in event["message"].items()}
        elif name == "content_block_start":
            message["content"].append(dict(event["content_block"]))
        elif name == "content_block_delta":
            block, delta = message["content"][event["index"]], event["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "input_json_delta":
                partial[event["index"]] = partial.get(event["index"], "") + delta["partial_json"]
                block["input"] = (
                    json.loads(partial[event["index"]]) if _complete(partial[event["index"]]) else {}
                )
        elif name == "message_delta":
            message.update(event["delta"])
            message["usage"] = event["usage"]
    return message


def _complete(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


event_trees = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.sampled_from(
        ["", "x", "text", "tool_use", "thinking", "text_delta", "input_json_delta", "thinking_delta", "stop"]
    ),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "type",
                    "index",
                    "delta",
                    "content_block",
                    "message",
                    "usage",
                    "choices",
                    "content",
                    "tool_calls",
                    "function",
                    "arguments",
                    "name",
                    "id",
                    "text",
                    "partial_json",
                    "thinking",
                    "stop_reason",
                    "finish_reason",
                    "input",
                    "reasoning_content",
                ]
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=16,
)
event_names = st.sampled_from(
    [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "ping",
    ]
)


@given(st.lists(st.tuples(event_names, event_trees), max_size=8))
def test_any_upstream_events_translate(upstream: list[tuple[str, Any]]) -> None:
    stream = b"".join(b"event: " + n.encode() + b"\ndata: " + orjson.dumps(d) + b"\n\n" for n, d in upstream)
    for out in (to_chat([stream], include_usage=True)[0], to_messages([stream])[0]):
        for _, data in events(out):
            assert data == "[DONE]" or isinstance(json.loads(data), dict)


def test_an_event_that_is_not_a_json_object_breaks_a_translated_stream() -> None:
    """Stream review: a truncated upstream chunk was skipped, and the translated answer lost its
    text yet ended whole (end_turn, completed); it is the upstream's failure, as the Rust rewriters
    of same-shape streams take it."""
    head = chat_sse({"choices": [{"index": 0, "delta": {"content": "Hello"}}]})
    broken = b'data: {"id":"up","choices":[{"index":0,"delta":{"content":"bro\n\n'
    out, messages = to_messages([head + broken + OPENAI_FIXTURE])
    assert messages.error == MALFORMED_EVENT_ERROR and not messages.done
    assert b"message_stop" not in out
    block = anthropic_sse(
        ("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
    )
    out, chat = to_chat(
        [ANTHROPIC_FIXTURE.split(b"event: content_block_stop")[0] + b"data: text\n\n" + block]
    )
    assert chat.error == MALFORMED_EVENT_ERROR and not chat.done and b"[DONE]" not in out
    # White space alone is no event, not a break.
    _, whole = to_messages([b"data: \n\n" + OPENAI_FIXTURE])
    assert whole.error is None and whole.done


def test_only_the_first_choice_makes_a_translated_answer() -> None:
    """Stream review: an upstream streaming two choices (each chunk one of them) had both merged
    into one answer, with the second's finish reason."""
    stream = chat_sse(
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "AAA"}}]},
        {"choices": [{"index": 1, "delta": {"role": "assistant", "content": "BBB"}}]},
        {"choices": [{"index": 0, "delta": {"content": " aaa"}, "finish_reason": "stop"}]},
        {"choices": [{"index": 1, "delta": {"content": " bbb"}, "finish_reason": "length"}]},
        "[DONE]",
    )
    out, translator = to_messages([stream])
    assert translator.output_text == "AAA aaa" and translator.done
    deltas = [json.loads(d) for name, d in events(out) if name in ("content_block_delta", "message_delta")]
    assert deltas[-1]["delta"]["stop_reason"] == "end_turn"


def test_an_upstream_stream_of_done_alone_is_no_answer() -> None:
    """Stream review: an upstream stream that was only `data: [DONE]` became a completed, empty
    answer with no usage; it is the upstream's failure (EMPTY_STREAM_ERROR), as in the Rust
    rewriter of a native chat stream, so another attempt runs and nothing is billed."""
    out, translator = to_messages([b"data: [DONE]\n\n"])
    assert translator.error == EMPTY_STREAM_ERROR and not translator.done and out == b""

"""The chat stream rewriter and the whole-body helpers, through Python."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.core import (
    EMPTY_STREAM_ERROR,
    MALFORMED_EVENT_ERROR,
    ChatStreamRewriter,
    InvalidJsonError,
    StreamUsage,
    parse_chat_usage,
    parse_messages_usage,
    set_json_id,
    stamp_answer,
)

FIXTURE = (Path(__file__).resolve().parents[1] / "fixtures" / "sse" / "openai_chat_stream.txt").read_bytes()


def run(chunks: list[bytes], forward_usage: bool = True) -> tuple[bytes, ChatStreamRewriter]:
    rw = ChatStreamRewriter("chatcmpl-gw", forward_usage)
    out = b"".join(rw.feed(c) for c in chunks) + rw.finish()
    return out, rw


def data_events(out: bytes) -> list[str]:
    return [e.removeprefix(b"data: ").decode() for e in out.split(b"\n\n") if e]


def test_every_chunk_gets_the_gateway_id_and_nothing_else_changes() -> None:
    out, rw = run([FIXTURE])
    events = data_events(out)
    originals = data_events(FIXTURE)
    assert events[-1] == "[DONE]" and rw.done
    for new, old in zip(events[:-1], originals[:-1], strict=True):
        assert json.loads(new)["id"] == "chatcmpl-gw"
        assert new == old.replace('"chatcmpl-upstream123"', '"chatcmpl-gw"')
    assert rw.chunks == 12
    assert rw.output_text == "Hello! How can I help you today?"
    assert rw.saw_output and rw.finish_reason == "stop" and rw.error is None
    assert rw.usage is not None
    assert (rw.usage.prompt_tokens, rw.usage.completion_tokens, rw.usage.total_tokens) == (9, 9, 18)


def test_usage_chunk_withheld_when_client_did_not_ask() -> None:
    out, rw = run([FIXTURE], forward_usage=False)
    assert b"prompt_tokens" not in out
    assert rw.usage is not None and rw.usage.completion_tokens == 9


@given(st.lists(st.integers(min_value=0, max_value=len(FIXTURE)), max_size=12), st.booleans())
def test_same_output_however_split(cuts: list[int], forward_usage: bool) -> None:
    points = sorted(cuts)
    chunks = [FIXTURE[a:b] for a, b in zip([0, *points], [*points, len(FIXTURE)], strict=True)]
    whole, _ = run([FIXTURE], forward_usage)
    split, rw = run(chunks, forward_usage)
    assert split == whole
    assert rw.output_text == "Hello! How can I help you today?"


def test_error_chunk_is_kept_back() -> None:
    out, rw = run([b'data: {"choices":[{"delta":{"content":"a"}}]}\n\ndata: {"error":{"message":"x"}}\n\n'])
    assert len(data_events(out)) == 1
    assert rw.error == b'{"error":{"message":"x"}}'


def test_set_json_id_and_usage() -> None:
    body = b'{"id": "up", "choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 3}}'
    assert set_json_id(body, "gw") == body.replace(b'"up"', b'"gw"')
    usage = parse_chat_usage(body)
    assert usage is not None and usage.total_tokens == 5 and usage.cached_tokens == 0
    assert parse_chat_usage(b'{"usage": null}') is None
    for bad in (b"", b"[]", b'{"a":', b"nope"):
        with pytest.raises(InvalidJsonError):
            set_json_id(bad, "x") if bad != b"[]" else parse_chat_usage(bad)


@given(
    st.dictionaries(
        st.text(max_size=6),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=8),
            lambda inner: (
                st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
            ),
            max_leaves=10,
        ),
        max_size=6,
    ),
    st.text(max_size=20),
    st.booleans(),
)
def test_set_json_id_property(obj: dict[str, object], new_id: str, indent: bool) -> None:
    body = json.dumps(obj, indent=2 if indent else None).encode()
    assert json.loads(set_json_id(body, new_id)) == {**obj, "id": new_id}


_USAGES = st.none() | st.fixed_dictionaries(
    {},
    optional={
        "prompt_tokens": st.integers(0, 10**6),
        "completion_tokens": st.integers(0, 10**6),
        "input_tokens": st.integers(0, 10**6),
        "output_tokens": st.integers(0, 10**6),
        "cache_read_input_tokens": st.integers(0, 10**6),
        "prompt_tokens_details": st.fixed_dictionaries({"cached_tokens": st.integers(0, 100)}),
    },
)


def _outcome(read: Callable[[], tuple[bytes, StreamUsage | None]]) -> object:
    """What one way of reading an answer gives: the stamped answer and its usage's counts, or the
    InvalidJsonError it raised."""
    try:
        stamped, usage = read()
    except InvalidJsonError:
        return InvalidJsonError
    return stamped, None if usage is None else (
        usage.prompt_tokens,
        usage.completion_tokens,
        usage.cached_tokens,
    )


@given(
    st.one_of(
        st.builds(
            lambda usage, extra, id_first: json.dumps(
                {"id": "up", **extra, "usage": usage} if id_first else {**extra, "usage": usage}
            ).encode(),
            _USAGES,
            st.dictionaries(st.sampled_from(["a", "model", "choices", "content"]), st.integers(), max_size=3),
            st.booleans(),
        ),
        st.binary(max_size=40),
        st.sampled_from([b'{"usage": 5}', b'{"usage": {}, "usage": null}', b'{"id": 1} x', b"[]", b""]),
    ),
    st.text(max_size=12),
    st.sampled_from(["chat", "messages"]),
)
def test_stamp_answer_is_set_json_id_and_the_usage_in_one(
    body: bytes, new_id: str, shape: Literal["chat", "messages"]
) -> None:
    # What forward_plain did before stamp_answer: set_json_id, then the shape's usage parser.
    parse = parse_chat_usage if shape == "chat" else parse_messages_usage
    two_calls = _outcome(lambda: (set_json_id(body, new_id), parse(body)))
    assert _outcome(lambda: stamp_answer(body, new_id, shape)) == two_calls


def test_stamp_answer_refuses_an_unknown_shape() -> None:
    with pytest.raises(ValueError, match="unknown answer shape"):
        stamp_answer(b"{}", "x", "rerank")  # type: ignore[arg-type]


def test_set_json_id_rejects_what_is_not_one_json_object() -> None:
    for bad in (b'{"a":xyz}', b'{"a":1} trailing', b'{"a":[1}}', b"[]", b'"s"', b"{", b"\xff"):
        with pytest.raises(InvalidJsonError):
            set_json_id(bad, "x")
    assert set_json_id(b' {"a": {"id": 1}} ', 'q"') == b' {"id":"q\\"","a": {"id": 1}} '


def test_set_json_id_replaces_escaped_and_duplicate_keys() -> None:
    assert set_json_id(b'{"\\u0069d":1,"b":2,"id":null}', "gw") == b'{"\\u0069d":"gw","b":2,"id":"gw"}'


@pytest.mark.parametrize("bad", [b"hello", b"[1, 2]", b'{"choices":[{"delta":{"content":"bro'])
def test_data_that_is_not_an_object_breaks_the_stream(bad: bytes) -> None:
    """Stream review: forwarded as it came (with the upstream's id), it broke the openai client's
    parser with a JSONDecodeError instead of the shape's error event (spec 6.1.2, 6.1.7)."""
    hello = b'data: {"choices":[{"delta":{"content":"Hello"}}]}\n\n'
    out, rw = run([hello, b"data: " + bad + b"\n\n", b'data: {"choices":[{"delta":{"content":"!"}}]}\n\n'])
    assert out == hello.replace(b"{", b'{"id":"chatcmpl-gw",', 1)
    assert rw.error == MALFORMED_EVENT_ERROR and rw.chunks == 1 and not rw.done


def test_unexpected_field_types_do_not_stop_the_rewrite() -> None:
    out, rw = run(
        [
            b'data: {"id":"up","model":7,"choices":[{"delta":{"content":[{"type":"text","text":"hi"}]},'
            b'"finish_reason":null}],"usage":{"prompt_tokens":2.0,"completion_tokens":"n/a"}}\n\n',
            b'data: {"id":"up","choices":{"odd":true}}\n\n',
        ]
    )
    first, second = (json.loads(e) for e in data_events(out))
    assert first["id"] == second["id"] == "chatcmpl-gw" and second["choices"] == {"odd": True}
    assert rw.chunks == 2 and rw.output_text == "hi" and rw.model is None
    assert rw.usage is not None and (rw.usage.prompt_tokens, rw.usage.completion_tokens) == (2, 0)


def test_reasoning_and_tool_calls_are_output_and_nothing_follows_done() -> None:
    out, rw = run(
        [
            b'data: {"choices":[{"delta":{"reasoning_content":"think ","tool_calls":[{"index":0,'
            b'"function":{"name":"get","arguments":"{\\"a\\":1}"}}]},"finish_reason":"tool_calls"}]}\n\n',
            b"data: [DONE]\n\n",
            b'data: {"choices":[{"delta":{"content":"late"}}]}\n\n',
        ],
        forward_usage=False,
    )
    assert rw.output_text == 'think get{"a":1}' and rw.finish_reason == "tool_calls"
    assert rw.done and rw.chunks == 1 and out.endswith(b"data: [DONE]\n\n") and not rw.awaits_usage


def test_done_waits_for_the_usage_the_client_asked_for_when_none_came() -> None:
    """The client asked for usage (forward_usage) and the upstream sent none: [DONE] is held back
    for the caller to end the stream with the gateway's own count (routes/chat.py)."""
    chunks = [b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n', b"data: [DONE]\n\n"]
    out, rw = run(chunks)
    assert rw.done and rw.awaits_usage and b"[DONE]" not in out and rw.chunks == 1
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}\n\n'
    out, rw = run([chunks[0], usage, chunks[1]])
    assert rw.done and not rw.awaits_usage and out.endswith(b"data: [DONE]\n\n")


def test_usage_details_and_model_from_first_chunk() -> None:
    usage_chunk = (
        b'{"model":"b","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15,'
        b'"prompt_tokens_details":{"cached_tokens":4},"completion_tokens_details":{"reasoning_tokens":3}}}'
    )
    out, rw = run([b'data: {"model":"a","choices":[]}\n\n', b"data: " + usage_chunk + b"\n\n"], False)
    assert rw.model == "a" and rw.chunks == 1 and b"usage" not in out
    usage = rw.usage
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (10, 5, 15)
    assert (usage.cached_tokens, usage.reasoning_tokens) == (4, 3)


def test_multi_line_data_stays_one_event() -> None:
    out, rw = run([b'data: {"a":\r\ndata: 1}\r\n\r\n'])
    assert out == b'data: {"id":"chatcmpl-gw","a":\ndata: 1}\n\n' and rw.chunks == 1


chunk_events = st.one_of(
    st.text(max_size=8).map(lambda t: json.dumps({"id": "u", "choices": [{"delta": {"content": t}}]})),
    st.just('{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}'),
    st.just("not json"),
    st.just("[DONE]"),
)
synthetic = st.lists(
    st.tuples(chunk_events, st.sampled_from(["\n\n", "\r\n\r\n", "\r\r", "\n: ping\n\n"])), max_size=12
).map(lambda evs: "".join(f"data: {e}{end}" for e, end in evs).encode())


@given(synthetic, st.lists(st.integers(min_value=0), max_size=10), st.booleans())
def test_synthetic_streams_same_however_split(data: bytes, cuts: list[int], forward_usage: bool) -> None:
    points = sorted(c % (len(data) + 1) for c in cuts)
    chunks = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    whole, rw_whole = run([data], forward_usage)
    split, rw = run(chunks, forward_usage)
    assert split == whole
    assert (rw.output_text, rw.chunks, rw.done) == (rw_whole.output_text, rw_whole.chunks, rw_whole.done)
    for event in data_events(split):
        if event.startswith("{"):
            assert json.loads(event)["id"] == "chatcmpl-gw"


def test_finish_flushes_an_event_without_its_blank_line() -> None:
    rw = ChatStreamRewriter("gw", True)
    assert rw.feed(b'data: {"choices":[{"delta":{"content":"x"}}]}') == b""
    assert rw.finish() == b'data: {"id":"gw","choices":[{"delta":{"content":"x"}}]}\n\n'
    assert rw.output_text == "x" and rw.chunks == 1 and not rw.done


def test_done_before_any_chunk_is_no_answer() -> None:
    """Stream review: passed on, it gave a client that asked for usage no usage chunk (the openai
    client's stream helper raised IndexError); it is the upstream's failure, as an error event is."""
    for forward_usage in (True, False):
        out, rw = run([b"data: [DONE]\n\n"], forward_usage)
        assert out == b"" and rw.error == EMPTY_STREAM_ERROR and not rw.done

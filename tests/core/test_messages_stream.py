"""The message-style (Anthropic Messages API) stream rewriter and whole-body usage, through Python."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.core import InvalidJsonError, MessagesStreamRewriter, SseParser, parse_messages_usage

FIXTURE = (
    Path(__file__).resolve().parents[1] / "fixtures" / "sse" / "anthropic_messages_stream.txt"
).read_bytes()


def run(chunks: list[bytes]) -> tuple[bytes, MessagesStreamRewriter]:
    rw = MessagesStreamRewriter("msg_gw")
    out = b"".join(rw.feed(c) for c in chunks) + rw.finish()
    return out, rw


def events(out: bytes) -> list[tuple[str | None, str]]:
    parser = SseParser()
    return [(e.event, e.data) for e in [*parser.feed(out), *parser.finish()]]


def test_names_kept_ids_set_and_done_added() -> None:
    out, rw = run([FIXTURE])
    got = events(out)
    original = events(FIXTURE)
    assert [name for name, _ in got] == [name for name, _ in original] + [None]
    assert got[-1] == (None, "[DONE]")
    for (_, new), (_, old) in zip(got[:-1], original, strict=True):
        new_obj, old_obj = json.loads(new), json.loads(old)
        assert new_obj.pop("id") == "msg_gw"
        if "message" in old_obj:
            assert new_obj["message"].pop("id") == "msg_gw"
            old_obj["message"].pop("id")
        assert new_obj == old_obj
    assert rw.done and rw.chunks == 8 and rw.saw_output and rw.error is None
    assert rw.output_text == "Hello!"
    assert rw.model == "claude-sonnet-4-5" and rw.finish_reason == "end_turn"
    assert rw.usage is not None
    assert (rw.usage.prompt_tokens, rw.usage.completion_tokens, rw.usage.total_tokens) == (25, 15, 40)


def test_only_the_ids_change_byte_for_byte() -> None:
    out, _ = run([FIXTURE])
    expected = (
        FIXTURE.replace(b'"msg_01XFDUDYJgAACzvnptvVoYEL"', b'"msg_gw"').replace(
            b'data: {"type"', b'data: {"id":"msg_gw","type"'
        )
        + b"data: [DONE]\n\n"
    )
    assert out == expected


@given(st.lists(st.integers(min_value=0, max_value=len(FIXTURE)), max_size=12))
def test_same_output_however_split(cuts: list[int]) -> None:
    points = sorted(cuts)
    chunks = [FIXTURE[a:b] for a, b in zip([0, *points], [*points, len(FIXTURE)], strict=True)]
    whole, _ = run([FIXTURE])
    split, rw = run(chunks)
    assert split == whole
    assert rw.output_text == "Hello!" and rw.done


def test_error_event_is_kept_back_and_ends_the_stream() -> None:
    error = b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}'
    out, rw = run(
        [
            b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
            b'"delta":{"type":"text_delta","text":"a"}}\n\n',
            b"event: error\ndata: " + error + b"\n\n",
            b'event: ping\ndata: {"type":"ping"}\n\n',
        ]
    )
    assert [name for name, _ in events(out)] == ["content_block_delta"]
    assert rw.error == error and not rw.done and rw.output_text == "a"


def test_thinking_tool_input_and_cache_reads() -> None:
    stream = (
        b'event: message_start\ndata: {"type":"message_start","message":{"id":"m","model":"x",'
        b'"usage":{"input_tokens":3,"cache_read_input_tokens":10,"cache_creation_input_tokens":2,'
        b'"output_tokens":1}}}\n\n'
        b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
        b'"delta":{"type":"thinking_delta","thinking":"hmm "}}\n\n'
        b'event: content_block_delta\ndata: {"type":"content_block_delta","index":1,'
        b'"delta":{"type":"input_json_delta","partial_json":"{\\"city\\": \\"Paris\\"}"}}\n\n'
        b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"tool_use"},'
        b'"usage":{"output_tokens":20}}\n\n'
    )
    _, rw = run([stream])
    assert rw.output_text == 'hmm {"city": "Paris"}'
    assert rw.finish_reason == "tool_use" and not rw.done
    assert rw.usage is not None
    usage = rw.usage
    assert (usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens) == (15, 10, 20)
    assert usage.total_tokens == 35 and usage.reasoning_tokens == 0


def test_no_usage_until_one_arrives_and_upstream_done_is_not_doubled() -> None:
    out, rw = run([b"data: [DONE]\n\n", b'event: message_stop\ndata: {"type":"message_stop"}\n\n'])
    assert rw.usage is None
    assert events(out) == [("message_stop", '{"id":"msg_gw","type":"message_stop"}'), (None, "[DONE]")]


def test_parse_messages_usage() -> None:
    body = b'{"id":"m","usage":{"input_tokens":5,"cache_read_input_tokens":4,"output_tokens":7}}'
    usage = parse_messages_usage(body)
    assert usage is not None
    assert (usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens, usage.total_tokens) == (
        9,
        4,
        7,
        16,
    )
    assert parse_messages_usage(b'{"id":"m"}') is None
    for bad in (b"", b"[]", b'{"usage":', b"nope"):
        with pytest.raises(InvalidJsonError):
            parse_messages_usage(bad)


@given(st.binary(max_size=300), st.lists(st.integers(min_value=0, max_value=300), max_size=6))
def test_arbitrary_bytes_same_however_split(data: bytes, cuts: list[int]) -> None:
    points = sorted(min(c, len(data)) for c in cuts)
    chunks = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    assert run(chunks)[0] == run([data])[0]

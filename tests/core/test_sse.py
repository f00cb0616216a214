"""The SSE parser through Python: split anywhere, same events."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from gateway.core import SseParser

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sse"


def parse(chunks: list[bytes]) -> list[tuple[str | None, str, str | None, int | None]]:
    parser = SseParser()
    events = [e for chunk in chunks for e in parser.feed(chunk)] + parser.finish()
    return [(e.event, e.data, e.id, e.retry) for e in events]


def test_fields_comments_and_line_ends() -> None:
    events = parse([b":c\r\nevent: a\r\nid: 1\nretry: 50\rdata: x\ndata: y\n\ndata: z"])
    assert events == [("a", "x\ny", "1", 50), (None, "z", None, None)]


def test_anthropic_fixture_event_names() -> None:
    events = parse([(FIXTURES / "anthropic_messages_stream.txt").read_bytes()])
    assert [e[0] for e in events] == [
        "message_start",
        "content_block_start",
        "ping",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]


line = st.one_of(
    st.text(max_size=15).map(lambda s: "data: " + s.replace("\r", "").replace("\n", "")),
    st.sampled_from(["event: x", ": comment", "", "retry: 10", "id: 7", "data"]),
)
stream = st.lists(st.tuples(line, st.sampled_from(["\n", "\r\n", "\r"])), max_size=30).map(
    lambda lines: "".join(text + end for text, end in lines).encode()
)


@given(stream, st.lists(st.integers(min_value=0), max_size=10))
def test_same_events_however_split(data: bytes, cuts: list[int]) -> None:
    points = sorted(c % (len(data) + 1) for c in cuts)
    chunks = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    assert parse(chunks) == parse([data])


@given(stream)
def test_byte_by_byte(data: bytes) -> None:
    assert parse([data[i : i + 1] for i in range(len(data))]) == parse([data])


def test_fixture_split_everywhere() -> None:
    data = (FIXTURES / "crlf_and_comments.txt").read_bytes()
    whole = parse([data])
    for i in range(len(data) + 1):
        assert parse([data[:i], data[i:]]) == whole


def test_bom_only_at_the_very_start_even_split() -> None:
    stream = b"\xef\xbb\xbfdata: a\n\n\xef\xbb\xbfdata: b\n\ndata: c\n\n"
    assert parse([stream]) == [(None, "a", None, None), (None, "c", None, None)]
    assert parse([stream[:1], stream[1:2], stream[2:]]) == parse([stream])


def test_cr_at_chunk_end_then_lf_is_one_line_end() -> None:
    assert parse([b"data: a\r", b"\n", b"\r", b"\ndata: b\r", b"\r"]) == [
        (None, "a", None, None),
        (None, "b", None, None),
    ]


def test_event_without_data_dropped_empty_name_is_none_and_id_is_per_event() -> None:
    stream = b"event: ping\nid: 9\n\nevent:\ndata:\n\ndata: x\nid: 3\n\ndata: y\n\n"
    assert parse([stream]) == [(None, "", None, None), (None, "x", "3", None), (None, "y", None, None)]


def test_one_space_stripped_and_invalid_utf8_replaced() -> None:
    assert parse([b"data:  two\ndata:none\ndata: \xff\n\n"]) == [(None, " two\nnone\n\ufffd", None, None)]


def test_golden_fixtures() -> None:
    openai = parse([(FIXTURES / "openai_chat_stream.txt").read_bytes()])
    assert openai[-1] == (None, "[DONE]", None, None)
    assert all(json.loads(data)["object"] == "chat.completion.chunk" for _, data, _, _ in openai[:-1])
    mixed = parse([(FIXTURES / "crlf_and_comments.txt").read_bytes()])
    assert mixed == [
        (None, '{"a":1}', None, None),
        ("note", "line one\nline two", None, None),
        (None, "[DONE]", "3", None),
    ]


@given(st.binary(max_size=200), st.lists(st.integers(min_value=0, max_value=200), max_size=8))
def test_arbitrary_bytes_same_events_however_split(data: bytes, cuts: list[int]) -> None:
    points = sorted(min(c, len(data)) for c in cuts)
    chunks = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    assert parse(chunks) == parse([data])

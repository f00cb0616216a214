"""AWS's binary event stream (Bedrock's ConverseStream framing) through the Rust parser, against the
simulator's encoder, written from the format's description independently of the parser."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core import EventStreamParser, InvalidEventStreamError
from gateway.sim.bedrock import message as frame

# The message of AWS's documentation: one string header, the payload {'foo':'bar'}.
AWS_EXAMPLE = bytes.fromhex(
    "0000003d0000002007fd83960c636f6e74656e742d747970650700106170706c69636174696f6e2f6a736f6e"
    "7b27666f6f273a27626172277d8d9c08b1"
)


def parse(data: bytes, cuts: list[int]) -> list[tuple[dict[str, str | bytes | int | bool], bytes]]:
    parser = EventStreamParser()
    out = []
    start = 0
    for cut in [*sorted(cuts), len(data)]:
        out += parser.feed(data[start:cut])
        start = cut
    parser.finish()
    return [(m.headers, m.payload) for m in out]


def test_the_documented_example() -> None:
    ((headers, payload),) = parse(AWS_EXAMPLE, [3, 20, 50])
    assert headers == {"content-type": "application/json"} and payload == b"{'foo':'bar'}"
    assert frame([("content-type", "application/json")], b"{'foo':'bar'}") == AWS_EXAMPLE


names = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=20).filter(
    lambda n: len(n.encode()) < 256
)
messages = st.lists(
    st.tuples(st.lists(st.tuples(names, st.text(max_size=40)), max_size=4), st.binary(max_size=300)),
    min_size=1,
    max_size=5,
)


@settings(max_examples=200, deadline=None)
@given(messages=messages, data=st.data())
def test_messages_parse_back_however_the_stream_is_cut(
    messages: list[tuple[list[tuple[str, str]], bytes]], data: st.DataObject
) -> None:
    stream = b"".join(frame(headers, payload) for headers, payload in messages)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=12))
    parsed = parse(stream, cuts)
    assert [p for _, p in parsed] == [p for _, p in messages]
    assert [h for h, _ in parsed] == [dict(h) for h, _ in messages]


@settings(max_examples=200, deadline=None)
@given(messages=messages, data=st.data())
def test_a_flipped_bit_is_refused_not_misread(
    messages: list[tuple[list[tuple[str, str]], bytes]], data: st.DataObject
) -> None:
    stream = bytearray(b"".join(frame(headers, payload) for headers, payload in messages))
    at = data.draw(st.integers(0, len(stream) - 1))
    stream[at] ^= 1 << data.draw(st.integers(0, 7))
    with pytest.raises(InvalidEventStreamError):
        parse(bytes(stream), [])


@settings(max_examples=300, deadline=None)
@given(junk=st.binary(max_size=500), cuts=st.lists(st.integers(0, 500), max_size=8))
def test_any_bytes_are_messages_or_invalid_event_stream_error(junk: bytes, cuts: list[int]) -> None:
    with contextlib.suppress(InvalidEventStreamError):
        parse(junk, [c for c in cuts if c <= len(junk)])


def test_a_cut_stream_is_refused_at_its_end() -> None:
    parser = EventStreamParser()
    assert parser.feed(AWS_EXAMPLE[:-1]) == []
    with pytest.raises(InvalidEventStreamError, match="ended inside a message"):
        parser.finish()


def test_a_broken_parser_stays_broken() -> None:
    parser = EventStreamParser()
    with pytest.raises(InvalidEventStreamError):
        parser.feed(b"\x00" * 16)
    with pytest.raises(InvalidEventStreamError):
        parser.feed(AWS_EXAMPLE)

"""An upstream that never ends an event cannot make the gateway hold more than MAX_EVENT_BYTES: the
parser stops, and every stream rewriter and translator ends the stream as after an upstream error."""

from __future__ import annotations

import pytest

from gateway.core import (
    MAX_EVENT_BYTES,
    OVERSIZED_EVENT_ERROR,
    ChatStreamRewriter,
    MessagesStreamRewriter,
    ResponsesStreamRewriter,
    SseParser,
)
from gateway.pricing import Usage
from gateway.translate import ChatStreamFromMessages, MessagesStreamFromChat

PIECE = b"x" * (1 << 20)


def test_parser_stops_and_holds_nothing() -> None:
    parser = SseParser()
    assert parser.feed(b"data: ") == []
    for _ in range(MAX_EVENT_BYTES // len(PIECE)):
        assert parser.feed(PIECE) == []
    assert parser.overflowed
    assert parser.feed(b"\n\ndata: after\n\n") == [] and parser.finish() == []


def no_usage(text: str) -> Usage:
    return Usage()


@pytest.mark.parametrize(
    "make",
    [
        lambda: ChatStreamRewriter("gw", True),
        lambda: MessagesStreamRewriter("gw"),
        lambda: ResponsesStreamRewriter("gw"),
        lambda: ChatStreamFromMessages("gw", True, 0, no_usage),
        lambda: MessagesStreamFromChat("gw", no_usage),
    ],
)
def test_every_stream_ends_as_after_an_upstream_error(make: object) -> None:
    rewriter = make()  # type: ignore[operator]
    rewriter.feed(b'data: {"a":"')
    for _ in range(MAX_EVENT_BYTES // len(PIECE)):
        assert rewriter.feed(PIECE) == b""
    assert rewriter.error == OVERSIZED_EVENT_ERROR and not rewriter.done

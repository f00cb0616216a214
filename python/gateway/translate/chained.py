"""A messages model's stream in a third shape: the upstream's message events become chat chunks
(ChatStreamFromMessages), which the shape's own translator reads (a FromChatStream: to responses).
The two are one StreamRewriter for routes/streaming.py: what was said and used from the translator
that reads the upstream (its usage is the upstream's own, cache writes included); the client's
events, whether the stream is done and how many events went out, from the shape's (the route's
`on_end` is handed `shape`: routes/translated.py)."""

from __future__ import annotations

from ..pricing import Usage
from .chat_stream import ChatStreamFromMessages
from .stream_base import FromChatStream


class MessagesThroughChat:
    def __init__(self, upstream: ChatStreamFromMessages, shape: FromChatStream) -> None:
        self.upstream = upstream
        self.shape = shape

    def feed(self, chunk: bytes) -> bytes:
        return self.shape.feed(self.upstream.feed(chunk))

    def finish(self) -> bytes:
        return self.shape.feed(self.upstream.finish()) + self.shape.finish()

    @property
    def error(self) -> bytes | None:
        return self.upstream.error or self.shape.error

    @property
    def done(self) -> bool:
        return self.shape.done

    @property
    def saw_output(self) -> bool:
        return self.upstream.saw_output

    @property
    def spoken(self) -> bool:
        return self.upstream.spoken

    @property
    def usage(self) -> Usage | None:
        return self.upstream.usage

    @property
    def output_text(self) -> str:
        return self.upstream.output_text

    @property
    def output_len(self) -> int:
        return self.upstream.output_len

    def output_upto(self, mark: int) -> str:
        return self.upstream.output_upto(mark)

    def reasoning_upto(self, mark: int) -> str:
        return self.upstream.reasoning_upto(mark)

    @property
    def chunks(self) -> int:
        return self.shape.chunks

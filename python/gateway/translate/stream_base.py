"""What both stream translators share: parsing the upstream's SSE bytes (in the Rust core), the
StreamRewriter state (routes/streaming.py) and the loop that hands each event to the shape's own
`_handle`, stopping at the end of the stream or the first upstream error."""

from __future__ import annotations

from ..core import OVERSIZED_EVENT_ERROR, SseEvent, SseParser


class TranslatedStream:
    def __init__(self) -> None:
        self._parser = SseParser()
        self._output: list[str] = []
        self.done = False
        self.saw_output = False
        self.error: bytes | None = None
        # Events sent to the client so far.
        self.chunks = 0

    @property
    def output_text(self) -> str:
        return "".join(self._output)

    @property
    def output_len(self) -> int:
        """A mark of the output so far (pieces collected), for `output_upto`."""
        return len(self._output)

    def output_upto(self, mark: int) -> str:
        return "".join(self._output[:mark])

    def feed(self, chunk: bytes) -> bytes:
        out = self._translate(self._parser.feed(chunk))
        if self._parser.overflowed and self.error is None:
            self.error = OVERSIZED_EVENT_ERROR  # the stream is broken, as after an error event
        return out

    def finish(self) -> bytes:
        return self._translate(self._parser.finish())

    def _translate(self, events: list[SseEvent]) -> bytes:
        out: list[bytes] = []
        for event in events:
            if self.done or self.error is not None:
                break
            self._handle(event, out)
        self.chunks += len(out)  # every entry of `out` is one whole event
        return b"".join(out)

    def _handle(self, event: SseEvent, out: list[bytes]) -> None:
        raise NotImplementedError

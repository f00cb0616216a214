"""What the stream translators share: parsing the upstream's SSE bytes (in the Rust core), the
StreamRewriter state (routes/streaming.py) and the loop that hands each event to the shape's own
`_handle`, stopping at the end of the stream or the first upstream error; and, for the two that
read a chat completions stream (to messages, to responses), the reading of its chunks."""

from __future__ import annotations

from typing import Any, TypeGuard

import orjson

from ..core import EMPTY_STREAM_ERROR, MALFORMED_EVENT_ERROR, OVERSIZED_EVENT_ERROR, SseEvent, SseParser
from ..pricing import Usage
from .usage import usage_from_chat


class TranslatedStream:
    def __init__(self) -> None:
        self._parser = SseParser()
        self._output: list[str] = []
        self._reasoning_pieces: list[int] = []  # which pieces of _output are reasoning (billed at its price)
        self.done = False
        self.saw_output = False
        self.spoken = False  # the shapes translated have no spoken output
        self.error: bytes | None = None
        # Events sent to the client so far.
        self.chunks = 0
        # The whole answer in the client's shape once the stream has ended, where the route keeps
        # it (a Response object: routes/kept_responses.py); None otherwise.
        self.answer: dict[str, Any] | None = None

    @property
    def output_text(self) -> str:
        return "".join(self._output)

    @property
    def output_len(self) -> int:
        """A mark of the output so far (pieces collected), for `output_upto`."""
        return len(self._output)

    def output_upto(self, mark: int) -> str:
        return "".join(self._output[:mark])

    def reasoning_upto(self, mark: int) -> str:
        """The reasoning among the output up to a mark of `output_len`."""
        return "".join(self._output[i] for i in self._reasoning_pieces if i < mark)

    def _take(self, text: Any, *, reasoning: bool = False) -> TypeGuard[str]:
        """Note a piece of output (of reasoning); False when there is none."""
        if not isinstance(text, str) or not text:
            return False
        if reasoning:
            self._reasoning_pieces.append(len(self._output))
        self._output.append(text)
        self.saw_output = True
        return True

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

    def malformed(self, data: str) -> None:
        """An event whose data is not a JSON object: the stream is broken there, as the Rust
        rewriters take it (review: skipped, a translated answer lost text and still ended whole).
        Data of only white space is nothing."""
        if data.strip() and self.error is None:
            self.error = MALFORMED_EVENT_ERROR


def _first_choice(choices: Any) -> dict[str, Any] | None:
    """A chunk's part of the first choice (index 0), the one a translated answer is made of
    (review: an upstream that streamed two choices had both merged into one answer)."""
    if isinstance(choices, list):
        for choice in choices:
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                return choice
    return None


def json_event(data: str) -> dict[str, Any] | None:
    """An event's data as the JSON object it should be; None when it is not one."""
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


class FromChatStream(TranslatedStream):
    """A translator of an upstream chat completions stream: reads each chunk (the first one starts
    the client's stream, the usage chunk is kept, an error chunk is kept back) and hands the first
    choice's delta to the shape's `_delta`; `data: [DONE]`, or the upstream's end after its finish
    chunk, to its `_end`."""

    def __init__(self) -> None:
        super().__init__()
        self._started = False
        self._finish_reason: Any = None
        self._usage: Usage | None = None

    @property
    def usage(self) -> Usage | None:
        return self._usage

    def finish(self) -> bytes:
        out = super().finish()
        if not self.done and self.error is None and self._finish_reason is not None:
            # An upstream that ends after its finish chunk without `data: [DONE]` is complete too.
            end: list[bytes] = []
            self._end(end)
            out += b"".join(end)
        return out

    def _handle(self, event: SseEvent, out: list[bytes]) -> None:
        if event.data.strip() == "[DONE]":
            if not self._started and self._usage is None:
                # No chunk at all: no answer, not an empty one (review: it was a completed one).
                self.error = EMPTY_STREAM_ERROR
                return
            self._end(out)
            return
        data = json_event(event.data)
        if data is None:
            self.malformed(event.data)
            return
        if data.get("error") is not None:
            self.error = event.data.encode()
            return
        if not self._started:
            self._start(data.get("model"), out)
        usage = data.get("usage")
        if isinstance(usage, dict):
            self._usage = usage_from_chat(usage)
        choice = _first_choice(data.get("choices"))
        if choice is None:
            return
        delta = choice.get("delta")
        if isinstance(delta, dict):
            self._delta(delta, out)
        if choice.get("finish_reason") is not None:
            self._finish_reason = choice["finish_reason"]

    def _start(self, model: Any, out: list[bytes]) -> None:
        """The client's stream begins (sets `_started`)."""
        raise NotImplementedError

    def _delta(self, delta: dict[str, Any], out: list[bytes]) -> None:
        raise NotImplementedError

    def _end(self, out: list[bytes]) -> None:
        """The upstream's stream is complete: the client's ends (sets `done`)."""
        raise NotImplementedError

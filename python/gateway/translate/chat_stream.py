"""An upstream Anthropic Messages stream as the chat completions stream the openai client reads.

Every chunk is `data: {chat.completion.chunk}` with the gateway's id; text deltas become content,
thinking deltas reasoning_content, a tool_use block a tool call (its id, name and empty arguments
first, then the argument fragments as they come). message_stop ends it with the finish chunk, the
usage chunk when the client asked for one (stream_options.include_usage) and `data: [DONE]`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from ..core import SseEvent
from ..pricing import Usage
from .stop_reasons import finish_reason
from .stream_base import TranslatedStream
from .usage import chat_usage, usage_from_messages


class ChatStreamFromMessages(TranslatedStream):
    """A StreamRewriter (routes/streaming.py) for a chat client of a messages model.

    `counted_usage(output_text)` is the gateway's own count, shown in the usage chunk only when the
    upstream reported no usage."""

    def __init__(
        self, response_id: str, include_usage: bool, created: int, counted_usage: Callable[[str], Usage]
    ) -> None:
        super().__init__()
        self._id = response_id
        self._include_usage = include_usage
        self._created = created
        self._counted_usage = counted_usage
        self._model: Any = None
        # Anthropic block index -> the tool call's index in the chat shape, and whether any of its
        # arguments went out yet.
        self._tool_index: dict[int, int] = {}
        self._tool_arguments_sent: dict[int, bool] = {}
        self._usage_fields: dict[str, Any] = {}
        self._stop_reason: Any = None
        # The role chunk, not sent yet. OpenAI's says `content: ""` when the answer begins with
        # text, and `content: null` (with the first tool call) when it begins otherwise: a streamed
        # answer of tool calls only then ends with null content, as the same answer not streamed.
        self._role_due = False

    @property
    def usage(self) -> Usage | None:
        return usage_from_messages(self._usage_fields) if self._usage_fields else None

    def _handle(self, event: SseEvent, out: list[bytes]) -> None:
        try:
            data = orjson.loads(event.data)
        except orjson.JSONDecodeError:
            return  # not an event of the message shape
        if not isinstance(data, dict):
            return
        kind = event.event or data.get("type")
        if kind == "error" or data.get("error") is not None:
            self.error = event.data.encode()
            return
        if kind == "message_start":
            message = data.get("message")
            if isinstance(message, dict):
                self._model = message.get("model")
                self._read_usage(message.get("usage"))
            self._role_due = True  # sent with the first block: its content depends on that block
        elif kind == "content_block_start":
            self._block_start(data, out)
        elif kind == "content_block_delta":
            self._block_delta(data, out)
        elif kind == "content_block_stop":
            index = data.get("index")
            if isinstance(index, int) and index in self._tool_index and not self._tool_arguments_sent[index]:
                # A tool called without arguments: the chat shape still wants a JSON object.
                out.append(self._arguments(index, "{}"))
        elif kind == "message_delta":
            delta = data.get("delta")
            if isinstance(delta, dict) and delta.get("stop_reason") is not None:
                self._stop_reason = delta["stop_reason"]
            self._read_usage(data.get("usage"))
        elif kind == "message_stop":
            self._end(out)

    def _read_usage(self, usage: Any) -> None:
        """Usage counts are cumulative: each one seen replaces the last."""
        if isinstance(usage, dict):
            self._usage_fields.update(
                (k, v)
                for k, v in usage.items()
                if isinstance(v, int) or (k == "cache_creation" and isinstance(v, dict))
            )

    def _block_start(self, data: dict[str, Any], out: list[bytes]) -> None:
        block, index = data.get("content_block"), data.get("index")
        if not isinstance(block, dict) or not isinstance(index, int):
            return
        kind = block.get("type")
        role_due, self._role_due = self._role_due, False
        if role_due and kind != "tool_use":
            out.append(self._chunk({"role": "assistant", "content": "" if kind == "text" else None}))
        if kind == "tool_use":
            self._tool_index[index] = len(self._tool_index)
            # Some upstreams give the whole input at the start rather than in deltas.
            tool_input = block.get("input")
            arguments = (
                orjson.dumps(tool_input).decode() if isinstance(tool_input, dict) and tool_input else ""
            )
            self._tool_arguments_sent[index] = bool(arguments)
            self._take(block.get("name"))
            self._take(arguments)
            self.saw_output = True
            call = {
                "index": self._tool_index[index],
                "id": block.get("id"),
                "type": "function",
                "function": {"name": block.get("name"), "arguments": arguments},
            }
            first = {"role": "assistant", "content": None} if role_due else {}
            out.append(self._chunk({**first, "tool_calls": [call]}))
        elif kind == "text" and self._take(block.get("text")):
            out.append(self._chunk({"content": block["text"]}))
        elif kind == "thinking" and self._take(block.get("thinking"), reasoning=True):
            out.append(self._chunk({"reasoning_content": block["thinking"]}))

    def _block_delta(self, data: dict[str, Any], out: list[bytes]) -> None:
        delta, index = data.get("delta"), data.get("index")
        if not isinstance(delta, dict):
            return
        kind = delta.get("type")
        if kind == "text_delta" and self._take(delta.get("text")):
            out.append(self._chunk({"content": delta["text"]}))
        elif kind == "thinking_delta" and self._take(delta.get("thinking"), reasoning=True):
            out.append(self._chunk({"reasoning_content": delta["thinking"]}))
        elif (
            kind == "input_json_delta"
            and isinstance(index, int)
            and index in self._tool_index
            and self._take(delta.get("partial_json"))
        ):
            self._tool_arguments_sent[index] = True
            out.append(self._arguments(index, delta["partial_json"]))

    def _end(self, out: list[bytes]) -> None:
        if self._role_due:  # an answer without a block: empty text
            self._role_due = False
            out.append(self._chunk({"role": "assistant", "content": ""}))
        out.append(self._chunk({}, finish_reason(self._stop_reason)))
        if self._include_usage:
            usage = self.usage or self._counted_usage(self.output_text)
            out.append(self._data({"choices": [], "usage": chat_usage(usage)}))
        out.append(b"data: [DONE]\n\n")
        self.done = True

    def _arguments(self, index: int, fragment: str) -> bytes:
        return self._chunk(
            {"tool_calls": [{"index": self._tool_index[index], "function": {"arguments": fragment}}]}
        )

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        return self._data(
            {"choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        )

    def _data(self, fields: dict[str, Any]) -> bytes:
        chunk = {
            "id": self._id,
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": self._model,
            **fields,
        }
        return b"data: " + orjson.dumps(chunk) + b"\n\n"

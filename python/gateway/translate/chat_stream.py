"""An upstream Anthropic Messages stream as the chat completions stream the openai client reads.

Every chunk is `data: {chat.completion.chunk}` with the gateway's id; text deltas become content,
thinking deltas reasoning_content, a tool_use block a tool call (its id, name and empty arguments
first, then the argument fragments as they come). message_stop ends it with the finish chunk, the
usage chunk when the client asked for one (stream_options.include_usage) and `data: [DONE]`. A
signed thinking block (or a redacted one) also goes out whole once it ends, as an entry of
`thinking_blocks` with its `index` among them (the field non-streamed answers carry:
translate.answers), for the client to send back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from ..core import SseEvent
from ..pricing import Usage
from .answers import thinking_block
from .chat_wire import DONE, ChatChunks
from .stop_reasons import finish_reason
from .stream_base import TranslatedStream, json_event
from .usage import chat_usage, usage_from_messages


class ChatStreamFromMessages(TranslatedStream):
    """A StreamRewriter (routes/streaming.py) for a chat client of a messages model.

    `counted_usage(output_text)` is the gateway's own count, shown in the usage chunk only when the
    upstream reported no usage."""

    def __init__(
        self, response_id: str, include_usage: bool, created: int, counted_usage: Callable[[str], Usage]
    ) -> None:
        super().__init__()
        # The model is named by message_start; the first delta says the role (ChatChunks.delta).
        self._chunks = ChatChunks(None, response_id, created)
        self._include_usage = include_usage
        self._counted_usage = counted_usage
        # Anthropic block index -> the tool call's index in the chat shape, and whether any of its
        # arguments went out yet.
        self._tool_index: dict[int, int] = {}
        self._tool_arguments_sent: dict[int, bool] = {}
        self._usage_fields: dict[str, Any] = {}
        self._stop_reason: Any = None
        # Anthropic block index -> the thinking block it opened, as it grows (text, signature).
        self._thinking: dict[int, dict[str, Any]] = {}
        self._thinking_sent = 0

    @property
    def usage(self) -> Usage | None:
        return usage_from_messages(self._usage_fields) if self._usage_fields else None

    def _handle(self, event: SseEvent, out: list[bytes]) -> None:
        data = json_event(event.data)
        if data is None:
            self.malformed(event.data)
            return
        kind = event.event or data.get("type")
        if kind == "error" or data.get("error") is not None:
            self.error = event.data.encode()
            return
        if kind == "message_start":
            message = data.get("message")
            if isinstance(message, dict):
                self._chunks.base["model"] = message.get("model")
                self._read_usage(message.get("usage"))
        elif kind == "content_block_start":
            self._block_start(data, out)
        elif kind == "content_block_delta":
            self._block_delta(data, out)
        elif kind == "content_block_stop":
            index = data.get("index")
            if isinstance(index, int) and index in self._tool_index and not self._tool_arguments_sent[index]:
                # A tool called without arguments: the chat shape still wants a JSON object.
                out.append(self._arguments(index, "{}"))
            elif isinstance(index, int) and index in self._thinking:
                self._thinking_ends(self._thinking.pop(index), out)
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
            out.append(self._chunks.delta({"tool_calls": [call]}))
        elif kind == "text" and self._take(block.get("text")):
            out.append(self._chunks.delta({"content": block["text"]}))
        elif kind in ("thinking", "redacted_thinking"):
            text = block.get("thinking")
            self._thinking[index] = {**block, "thinking": text if isinstance(text, str) else ""}
            if kind == "thinking" and self._take(block.get("thinking"), reasoning=True):
                out.append(self._chunks.delta({"reasoning_content": block["thinking"]}))

    def _thinking_ends(self, block: dict[str, Any], out: list[bytes]) -> None:
        kept = thinking_block(block)
        if kept is not None:
            out.append(self._chunks.delta({"thinking_blocks": [{"index": self._thinking_sent, **kept}]}))
            self._thinking_sent += 1

    def _block_delta(self, data: dict[str, Any], out: list[bytes]) -> None:
        delta, index = data.get("delta"), data.get("index")
        if not isinstance(delta, dict):
            return
        kind = delta.get("type")
        if kind == "text_delta" and self._take(delta.get("text")):
            out.append(self._chunks.delta({"content": delta["text"]}))
        elif kind == "thinking_delta" and self._take(delta.get("thinking"), reasoning=True):
            out.append(self._chunks.delta({"reasoning_content": delta["thinking"]}))
            if isinstance(index, int) and index in self._thinking:
                self._thinking[index]["thinking"] += delta["thinking"]
        elif kind == "signature_delta" and isinstance(index, int) and index in self._thinking:
            signature = delta.get("signature")
            if isinstance(signature, str):
                self._thinking[index]["signature"] = signature
        elif (
            kind == "input_json_delta"
            and isinstance(index, int)
            and index in self._tool_index
            and self._take(delta.get("partial_json"))
        ):
            self._tool_arguments_sent[index] = True
            out.append(self._arguments(index, delta["partial_json"]))

    def _end(self, out: list[bytes]) -> None:
        # An answer without a block still says the role (empty text) before its finish.
        out.append(self._chunks.delta({}, finish_reason(self._stop_reason)))
        if self._include_usage:
            usage = self.usage or self._counted_usage(self.output_text)
            out.append(self._chunks.usage_and_done(chat_usage(usage)))
        else:
            out.append(DONE)
        self.done = True

    def _arguments(self, index: int, fragment: str) -> bytes:
        return self._chunks.delta(
            {"tool_calls": [{"index": self._tool_index[index], "function": {"arguments": fragment}}]}
        )

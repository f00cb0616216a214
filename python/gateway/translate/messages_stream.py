"""An upstream chat completions stream as the Anthropic Messages stream the anthropic client reads.

The events are the family's own: message_start, then for each run of content one block
(content_block_start, content_block_delta with text_delta, thinking_delta or input_json_delta,
content_block_stop), then message_delta with the stop reason and usage, message_stop, and the
gateway's `data: [DONE]` as the Rust MessagesStreamRewriter adds it. Every event's JSON carries the
gateway's id at the top level, and message_start also as message.id.

The chat shape reports usage only at its end, so message_start carries the gateway's own count of
the prompt (as the family's message_start carries the input tokens) and 0 output tokens, and
message_delta the whole usage as the upstream reported it (input tokens included, which the
anthropic client and langchain-anthropic take from there).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from ..pricing import Usage
from .answers import reasoning_text
from .stop_reasons import stop_reason
from .stream_base import FromChatStream
from .usage import messages_usage

# An open content block: its kind ("text", "thinking" or "tool_use") and, for a tool call, the call's
# index in the chat shape.
Block = tuple[str, int]
# What a chat upstream sends when the tool calls of one message arrive out of order, which the
# message shape (one block after another) cannot express.
INTERLEAVED_TOOL_CALLS = orjson.dumps(
    {"error": {"message": "The model's provider interleaved tool calls.", "type": "api_error"}}
)


class MessagesStreamFromChat(FromChatStream):
    """A StreamRewriter (routes/streaming.py) for a messages client of a chat model.

    `counted_usage(output_text)` is the gateway's own count: its prompt tokens are message_start's
    input tokens; in message_delta it is shown only when the upstream reported no usage."""

    def __init__(self, response_id: str, counted_usage: Callable[[str], Usage]) -> None:
        super().__init__()
        self._id = response_id
        self._counted_usage = counted_usage
        self._open: Block | None = None
        self._blocks = 0
        # The chat shape's indexes of the tool calls seen so far.
        self._tool_calls: set[int] = set()

    def _delta(self, delta: dict[str, Any], out: list[bytes]) -> None:
        reasoning = reasoning_text(delta)
        if self._take(reasoning, reasoning=True):
            self._write_to(("thinking", -1), {"type": "thinking_delta", "thinking": reasoning}, out)
        for field in ("content", "refusal"):
            if self._take(delta.get(field)):
                self._write_to(("text", -1), {"type": "text_delta", "text": delta[field]}, out)
        calls = delta.get("tool_calls")
        for call in calls if isinstance(calls, list) else []:
            if isinstance(call, dict):
                self._tool_call(call, out)

    def _tool_call(self, call: dict[str, Any], out: list[bytes]) -> None:
        index = call.get("index")
        index = index if isinstance(index, int) else 0
        function = call.get("function")
        function = function if isinstance(function, dict) else {}
        if index not in self._tool_calls:
            self._close(out)
            self._tool_calls.add(index)
            self._open_block(
                ("tool_use", index),
                {"type": "tool_use", "id": call.get("id"), "name": function.get("name"), "input": {}},
                out,
            )
            self._take(function.get("name"))
            self.saw_output = True
        elif self._open != ("tool_use", index):
            self.error = INTERLEAVED_TOOL_CALLS
            return
        arguments = function.get("arguments")
        if self._take(arguments):
            self._event(
                "content_block_delta",
                {"index": self._blocks - 1, "delta": {"type": "input_json_delta", "partial_json": arguments}},
                out,
            )

    def _write_to(self, block: Block, delta: dict[str, Any], out: list[bytes]) -> None:
        """A text or thinking delta, in the open block of its kind or in a new one."""
        if self._open != block:
            self._close(out)
            empty = {"type": block[0], block[0]: ""}
            if block[0] == "thinking":
                empty["signature"] = ""
            self._open_block(block, empty, out)
        self._event("content_block_delta", {"index": self._blocks - 1, "delta": delta}, out)

    def _open_block(self, block: Block, content_block: dict[str, Any], out: list[bytes]) -> None:
        self._event("content_block_start", {"index": self._blocks, "content_block": content_block}, out)
        self._open = block
        self._blocks += 1

    def _close(self, out: list[bytes]) -> None:
        if self._open is not None:
            self._event("content_block_stop", {"index": self._blocks - 1}, out)
            self._open = None

    def _start(self, model: Any, out: list[bytes]) -> None:
        message = {
            "id": self._id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {**messages_usage(self._counted_usage("")), "output_tokens": 0},
        }
        self._event("message_start", {"message": message}, out)
        self._started = True

    def _end(self, out: list[bytes]) -> None:
        if not self._started:
            self._start(None, out)
        self._close(out)
        usage = self._usage or self._counted_usage(self.output_text)
        self._event(
            "message_delta",
            {
                "delta": {
                    "stop_reason": stop_reason(self._finish_reason, bool(self._tool_calls)),
                    "stop_sequence": None,
                },
                "usage": messages_usage(usage),
            },
            out,
        )
        self._event("message_stop", {}, out)
        out.append(b"data: [DONE]\n\n")
        self.done = True

    def _event(self, name: str, fields: dict[str, Any], out: list[bytes]) -> None:
        data = orjson.dumps({"id": self._id, "type": name, **fields})
        out.append(b"event: " + name.encode() + b"\ndata: " + data + b"\n\n")

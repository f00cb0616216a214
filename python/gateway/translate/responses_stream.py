"""An upstream chat completions stream as the Responses API stream the openai client reads.

The events are OpenAI's own, each numbered by `sequence_number` and carrying the gateway's id at the
top level (and as `response.id` in lifecycle events): response.created and response.in_progress,
then one output item after another: reasoning (reasoning_summary_part / reasoning_summary_text
events), the message (content_part and output_text or refusal events), a function_call item per
tool call (function_call_arguments events), each opened by response.output_item.added and closed by
response.output_item.done; then response.completed (or response.incomplete, when the upstream
stopped for length or a content filter) with the whole output and the usage, and the gateway's
`data: [DONE]` as the Rust ResponsesStreamRewriter adds it.

Tool calls may arrive interleaved (the chat shape numbers them); each is its own item, so their
deltas simply name their item's output_index.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from ..pricing import Usage
from .answers import reasoning_text
from .responses_answer import (
    call_arguments,
    finished_status,
    function_call_item,
    message_item,
    output_text_part,
    reasoning_item,
    refusal_part,
    response_object,
)
from .stream_base import FromChatStream


@dataclass(slots=True)
class OpenItem:
    """An output item being streamed: its kind ("reasoning", "message" or "function_call"), where it
    is in the output, and what it has said so far."""

    kind: str
    output_index: int
    item: dict[str, Any]
    part: str = ""  # the message's open content part: "output_text" or "refusal"
    parts: list[dict[str, Any]] = field(default_factory=list)  # the message's finished parts
    text: list[str] = field(default_factory=list)  # the open part's text, or a call's arguments


class ResponsesStreamFromChat(FromChatStream):
    """A StreamRewriter (routes/streaming.py) for a responses client of a chat model.

    `request` is the client's responses request (its settings are echoed in the Response object);
    `counted_usage(output_text)` is the gateway's own count, shown only when the upstream reports
    no usage. With `hold_end`, the stream's last events wait for `last_events()`, once the route
    has kept the answer (`self.answer`) or failed to."""

    def __init__(
        self,
        response_id: str,
        request: dict[str, Any],
        counted_usage: Callable[[str], Usage],
        created_at: int | None = None,
        *,
        hold_end: bool = False,
    ) -> None:
        super().__init__()
        self._id = response_id
        self._request = request
        self._counted_usage = counted_usage
        self._created_at = int(time.time()) if created_at is None else created_at
        self._model: Any = None
        self._sequence = 0
        self._items: list[dict[str, Any]] = []  # the output items, by output_index
        self._open: OpenItem | None = None  # the open reasoning or message item
        self._calls: dict[int, OpenItem] = {}  # tool calls by their chat index; open until the end
        self._hold_end = hold_end

    def _delta(self, delta: dict[str, Any], out: list[bytes]) -> None:
        reasoning = reasoning_text(delta)
        if self._take(reasoning, reasoning=True):
            self._reasoning(reasoning, out)
        for part in ("output_text", "refusal"):
            text = delta.get("content" if part == "output_text" else "refusal")
            if self._take(text):
                self._message(part, text, out)
        calls = delta.get("tool_calls")
        for call in calls if isinstance(calls, list) else []:
            if isinstance(call, dict):
                self._tool_call(call, out)

    def _reasoning(self, text: str, out: list[bytes]) -> None:
        item = self._open
        if item is None or item.kind != "reasoning":
            item = self._open_item("reasoning", reasoning_item(self._id, None), out)
            self._event(
                "response.reasoning_summary_part.added",
                {**self._summary_at(item), "part": {"type": "summary_text", "text": ""}},
                out,
            )
        item.text.append(text)
        self._event("response.reasoning_summary_text.delta", {**self._summary_at(item), "delta": text}, out)

    def _message(self, part: str, text: str, out: list[bytes]) -> None:
        item = self._open
        if item is None or item.kind != "message":
            item = self._open_item("message", message_item(self._id, None, "in_progress"), out)
        if item.part != part:
            self._close_part(item, out)
            item.part = part
            empty = output_text_part("") if part == "output_text" else refusal_part("")
            empty.pop("logprobs", None)
            self._event("response.content_part.added", {**self._content_at(item), "part": empty}, out)
        item.text.append(text)
        fields: dict[str, Any] = {**self._content_at(item), "delta": text}
        if part == "output_text":
            fields["logprobs"] = []
        self._event(
            "response.output_text.delta" if part == "output_text" else "response.refusal.delta", fields, out
        )

    def _tool_call(self, call: dict[str, Any], out: list[bytes]) -> None:
        index = call.get("index")
        index = index if isinstance(index, int) and not isinstance(index, bool) else 0
        function = call.get("function")
        function = function if isinstance(function, dict) else {}
        item = self._calls.get(index)
        if item is None:
            self._close(out)
            started = function_call_item(self._id, index, call.get("id"), function.get("name"), "")
            item = self._open_item(
                "function_call", {**started, "status": "in_progress"}, out, keep_open=False
            )
            self._calls[index] = item
            self._take(function.get("name"))
            self.saw_output = True
        arguments = function.get("arguments")
        if self._take(arguments):
            item.text.append(arguments)
            self._event(
                "response.function_call_arguments.delta",
                {"item_id": item.item["id"], "output_index": item.output_index, "delta": arguments},
                out,
            )

    def _open_item(
        self, kind: str, item: dict[str, Any], out: list[bytes], *, keep_open: bool = True
    ) -> OpenItem:
        """A new output item, after the open reasoning or message item (closed first)."""
        self._close(out)
        opened = OpenItem(kind, len(self._items), item)
        self._items.append(item)  # replaced by the finished item when it closes
        self._event("response.output_item.added", {"output_index": opened.output_index, "item": item}, out)
        if keep_open:
            self._open = opened
        return opened

    def _close(self, out: list[bytes]) -> None:
        """Finish the open reasoning or message item."""
        item, self._open = self._open, None
        if item is None:
            return
        if item.kind == "reasoning":
            text = "".join(item.text)
            part = {"type": "summary_text", "text": text}
            self._event("response.reasoning_summary_text.done", {**self._summary_at(item), "text": text}, out)
            self._event("response.reasoning_summary_part.done", {**self._summary_at(item), "part": part}, out)
            self._finish_item(item, {**item.item, "summary": [part]}, out)
            return
        self._close_part(item, out)
        status = finished_status(self._finish_reason) if self._finish_reason is not None else "completed"
        self._finish_item(item, {**item.item, "status": status, "content": item.parts}, out)

    def _close_part(self, item: OpenItem, out: list[bytes]) -> None:
        """Finish the message's open content part, if any."""
        if not item.part:
            return
        text = "".join(item.text)
        where = self._content_at(item)
        if item.part == "output_text":
            part = output_text_part(text)
            self._event("response.output_text.done", {**where, "text": text, "logprobs": []}, out)
        else:
            part = refusal_part(text)
            self._event("response.refusal.done", {**where, "refusal": text}, out)
        self._event("response.content_part.done", {**where, "part": part}, out)
        item.parts.append(part)
        item.part, item.text = "", []

    def _close_calls(self, out: list[bytes]) -> None:
        last = max(self._calls, default=None)
        for index, item in self._calls.items():
            arguments = call_arguments("".join(item.text))
            # The last call is the one a cut answer was cut in.
            cut = index == last and self._finish_reason is not None
            status = finished_status(self._finish_reason) if cut else "completed"
            where = {"item_id": item.item["id"], "output_index": item.output_index}
            if not item.text:  # the empty object its deltas, too, add up to
                self._event("response.function_call_arguments.delta", {**where, "delta": arguments}, out)
            self._event(
                "response.function_call_arguments.done",
                {
                    "item_id": item.item["id"],
                    "output_index": item.output_index,
                    "name": item.item["name"],
                    "arguments": arguments,
                },
                out,
            )
            self._finish_item(item, {**item.item, "status": status, "arguments": arguments}, out)
        self._calls.clear()

    def _finish_item(self, item: OpenItem, finished: dict[str, Any], out: list[bytes]) -> None:
        self._items[item.output_index] = finished
        self._event("response.output_item.done", {"output_index": item.output_index, "item": finished}, out)

    def _summary_at(self, item: OpenItem) -> dict[str, Any]:
        return {"item_id": item.item["id"], "output_index": item.output_index, "summary_index": 0}

    def _content_at(self, item: OpenItem) -> dict[str, Any]:
        return {
            "item_id": item.item["id"],
            "output_index": item.output_index,
            "content_index": len(item.parts),
        }

    def _response(self, status: str) -> dict[str, Any]:
        usage = None
        if status != "in_progress":
            usage = self._usage or self._counted_usage(self.output_text)
        return response_object(
            self._id,
            self._request,
            self._model,
            status,
            list(self._items) if status != "in_progress" else [],
            usage,
            created_at=self._created_at,
            finish_reason=self._finish_reason,
        )

    def _start(self, model: Any, out: list[bytes]) -> None:
        self._model = model
        self._started = True
        started = self._response("in_progress")
        self._event("response.created", {"response": started}, out)
        self._event("response.in_progress", {"response": started}, out)

    def _end(self, out: list[bytes]) -> None:
        if not self._started:
            self._start(None, out)
        self._close(out)
        self._close_calls(out)
        self.answer = self._response(finished_status(self._finish_reason))
        self.done = True
        if not self._hold_end:
            out += self._last_events(self.answer)

    def last_events(self, kept: bool) -> bytes:
        """The held end of the stream: response.completed (or .incomplete) saying whether the answer
        was kept (`store`), and the gateway's `data: [DONE]`."""
        assert self.answer is not None and self._hold_end, "the stream has ended, its end held"
        events = self._last_events({**self.answer, "store": kept and self.answer["store"]})
        self.chunks += len(events)
        return b"".join(events)

    def _last_events(self, answer: dict[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        self._event(f"response.{answer['status']}", {"response": answer}, out)
        out.append(b"data: [DONE]\n\n")
        return out

    def _event(self, name: str, fields: dict[str, Any], out: list[bytes]) -> None:
        data = orjson.dumps({"id": self._id, "type": name, "sequence_number": self._sequence, **fields})
        self._sequence += 1
        out.append(b"event: " + name.encode() + b"\ndata: " + data + b"\n\n")

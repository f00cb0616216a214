"""The output text of a whole answer in either text shape, for counting output tokens when the
upstream reported no usage: text, reasoning and tool calls (and the same of Responses API items)."""

from __future__ import annotations

from typing import Any

import orjson


def chat_output_text(body: bytes) -> str:
    """Every choice's content, reasoning content, spoken output's transcript and tool-call names
    and arguments."""
    data = orjson.loads(body)
    parts: list[str] = []
    for choice in data.get("choices") or []:
        message = choice.get("message") or {}
        for key in ("content", "reasoning_content"):
            if isinstance(message.get(key), str):
                parts.append(message[key])
        audio = message.get("audio")
        if isinstance(audio, dict) and isinstance(audio.get("transcript"), str):
            parts.append(audio["transcript"])
        for tool_call in message.get("tool_calls") or []:
            fn = tool_call.get("function") or {}
            parts.extend(v for v in (fn.get("name"), fn.get("arguments")) if isinstance(v, str))
    return "".join(parts)


def message_output_text(body: bytes) -> str:
    """Every block's text and thinking, and the input of tool_use blocks as JSON."""
    data = orjson.loads(body)
    parts: list[str] = []
    for block in data.get("content") or []:
        for key in ("text", "thinking"):
            if isinstance(block.get(key), str):
                parts.append(block[key])
        if block.get("type") == "tool_use":
            parts.append(orjson.dumps(block.get("input")).decode())
    return "".join(parts)


def response_item_text(item: dict[str, Any]) -> str:
    """The text of one Responses API item, input or output: message content, reasoning summary,
    tool call or tool output."""
    parts: list[str] = []
    for key in ("content", "summary", "output"):  # a function_call_output's output may be parts
        value = item.get(key)
        if isinstance(value, str):
            parts.append(value)
        for part in value if isinstance(value, list) else []:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
    parts.extend(item[k] for k in ("name", "arguments") if isinstance(item.get(k), str))
    return "".join(parts)


def response_output_text(body: bytes) -> str:
    """Every output item's text (a Response object)."""
    data = orjson.loads(body)
    output = data.get("output") if isinstance(data, dict) else None
    return "".join(response_item_text(item) for item in output or [] if isinstance(item, dict))

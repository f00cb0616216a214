"""Whole (non-streamed) answers from one text shape to the other.

Both take the upstream's answer with its id already the gateway's, and the usage the gateway billed
(the upstream's own, or the gateway's count when it reported none), so the client sees what it paid
for. They never fail on an answer of an unexpected shape: missing parts are simply absent.
"""

from __future__ import annotations

from typing import Any

import orjson

from ..pricing import Usage
from .stop_reasons import finish_reason, stop_reason
from .usage import chat_usage, messages_usage


def chat_completion_from_message(message: dict[str, Any], usage: Usage, created: int) -> dict[str, Any]:
    """An Anthropic message as a chat completion: text blocks are the content, thinking blocks the
    reasoning_content, tool_use blocks the tool calls. The signed thinking blocks are also kept
    whole in `thinking_blocks` (LiteLLM's field), which a client sends back on the assistant
    message: Anthropic refuses a tool loop's next turn with thinking on unless the turn that called
    the tools starts with them (messages_request_from_chat puts them back)."""
    texts: list[str] = []
    thinking: list[str] = []
    signed: list[dict[str, Any]] = []
    tool_calls: list[dict[str, Any]] = []
    blocks = message.get("content")
    for block in blocks if isinstance(blocks, list) else []:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind in THINKING_BLOCKS:
            if kind == "thinking" and isinstance(block.get("thinking"), str):
                thinking.append(block["thinking"])
            kept = thinking_block(block)
            if kept is not None:
                signed.append(kept)
        elif kind == "tool_use":
            tool_calls.append(
                {
                    "id": block.get("id"),
                    "type": "function",
                    "function": {
                        "name": block.get("name"),
                        "arguments": orjson.dumps(block.get("input", {})).decode(),
                    },
                }
            )
    reply: dict[str, Any] = {
        "role": "assistant",
        "content": "".join(texts) if texts or not tool_calls else None,
        "refusal": None,
    }
    if thinking:
        reply["reasoning_content"] = "".join(thinking)
    if signed:
        reply["thinking_blocks"] = signed
    if tool_calls:
        reply["tool_calls"] = tool_calls
    return {
        "id": message.get("id"),
        "object": "chat.completion",
        "created": created,
        "model": message.get("model"),
        "choices": [
            {
                "index": 0,
                "message": reply,
                "logprobs": None,
                "finish_reason": finish_reason(message.get("stop_reason")),
            }
        ],
        "usage": chat_usage(usage),
    }


# The content blocks of a messages model's reasoning: its thinking, signed, or a redacted part of it.
# A tuple, not a set: an upstream block's `type` may be any JSON value, a list too (unhashable).
THINKING_BLOCKS = ("thinking", "redacted_thinking")


def thinking_block(block: dict[str, Any]) -> dict[str, Any] | None:
    """A thinking or redacted_thinking block as it must be sent back (exactly its own fields), or
    None when it cannot be: a thinking block without a signature is refused upstream."""
    kind = block.get("type")
    if kind == "redacted_thinking":
        data = block.get("data")
        return {"type": "redacted_thinking", "data": data} if isinstance(data, str) and data else None
    if kind != "thinking":
        return None
    text, signature = block.get("thinking"), block.get("signature")
    if isinstance(text, str) and isinstance(signature, str) and signature:
        return {"type": "thinking", "thinking": text, "signature": signature}
    return None


def message_from_chat_completion(completion: dict[str, Any], usage: Usage) -> dict[str, Any]:
    """A chat completion's first choice as an Anthropic message: its reasoning becomes a thinking
    block, the content (or a refusal) a text block, tool calls tool_use blocks."""
    choice, reply = first_choice(completion)
    content: list[dict[str, Any]] = []
    reasoning = reasoning_text(reply)
    if reasoning:
        content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    text = content_text(reply.get("content"))
    refusal = reply.get("refusal")
    if text:
        content.append({"type": "text", "text": text})
    elif isinstance(refusal, str) and refusal:
        content.append({"type": "text", "text": refusal})
    calls = reply.get("tool_calls")
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            content.append(
                {
                    "type": "tool_use",
                    "id": call.get("id"),
                    "name": function.get("name"),
                    "input": tool_input(function.get("arguments")),
                }
            )
    return {
        "id": completion.get("id"),
        "type": "message",
        "role": "assistant",
        "model": completion.get("model"),
        "content": content,
        "stop_reason": stop_reason(
            choice.get("finish_reason"), any(b["type"] == "tool_use" for b in content)
        ),
        "stop_sequence": None,
        "usage": messages_usage(usage),
    }


def first_choice(completion: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A chat completion's first choice and its message (empty when absent or malformed)."""
    choices = completion.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    reply = choice.get("message")
    return choice, reply if isinstance(reply, dict) else {}


def reasoning_text(message: dict[str, Any]) -> str:
    """The reasoning of a chat message or delta: reasoning_content (DeepSeek and most servers) or
    reasoning (vLLM, OpenRouter), never both."""
    for field in ("reasoning_content", "reasoning"):
        text = message.get(field)
        if isinstance(text, str) and text:
            return text
    return ""


def content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def tool_input(arguments: Any) -> dict[str, Any]:
    """A tool call's arguments as a tool_use input. The message shape wants an object: arguments that
    are not a JSON object (a model's broken JSON) become an empty one."""
    try:
        parsed = orjson.loads(arguments) if isinstance(arguments, str) and arguments else {}
    except orjson.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}

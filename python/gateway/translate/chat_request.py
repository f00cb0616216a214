"""An Anthropic Messages request (Shape B) as the chat completions request a chat model takes.

`system` becomes the first message, `tool_result` blocks become tool messages (placed before the rest of
their user turn, right after the assistant's tool calls as the chat shape wants), `tool_use` blocks
become tool calls, `image` blocks become image_url parts, `document` blocks file parts (a PDF) or text.
Parameters without a counterpart (thinking, service tiers, server tools) are left out (spec 1.3); content
the chat shape cannot carry (documents given by URL or file id, images inside tool results) is a 400.
"""

from __future__ import annotations

from typing import Any

import orjson

from ..errors import invalid_request
from .carried import Carried
from .files import PDF_TYPE

# Same name and meaning in both shapes; top_k is kept for the chat models that know it (spec 1.3).
SAME_PARAMS = ("temperature", "top_p", "top_k")
# What chat_request_from_messages carries of a messages request; the rest is dropped (spec 1.3),
# and noted as such (registry.note_dropped).
FROM_MESSAGES = Carried(
    frozenset(
        {
            "model",
            "messages",
            "max_tokens",
            "system",
            "stop_sequences",
            "tools",
            "tool_choice",
            "metadata",
            "stream",
            "output_config",
            "output_format",
            *SAME_PARAMS,
        }
    ),
    {
        "user": "metadata",
        "stop": "stop_sequences",
        "response_format": "output_config",
        "parallel_tool_calls": "tool_choice",
        "max_completion_tokens": "max_tokens",
    },
)
# Content the chat shape has no place for, from earlier turns: dropped from the history.
UNSAID_BLOCKS = frozenset({"thinking", "redacted_thinking"})


def chat_request_from_messages(payload: dict[str, Any], max_tokens_field: str) -> dict[str, Any]:
    """`payload` is a messages body with a list of message objects and a positive max_tokens (checked
    by the route). `max_tokens_field` is where the limit goes: max_completion_tokens, or max_tokens
    for the OpenAI-compatible servers that only know that one."""
    messages = _system(payload.get("system"))
    for i, message in enumerate(payload["messages"]):
        messages.extend(_turn(message, f"messages[{i}]"))
    request: dict[str, Any] = {
        "model": payload.get("model"),
        "messages": messages,
        max_tokens_field: payload["max_tokens"],
    }
    carry_over(payload, request, SAME_PARAMS)
    stop = payload.get("stop_sequences")
    if stop is not None:
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise invalid_request("`stop_sequences` must be an array of strings.", "stop_sequences")
        if stop:
            request["stop"] = stop
    tools = _tools(payload.get("tools"))
    choice = payload.get("tool_choice")
    tool_choice = _tool_choice(choice) if choice is not None else None
    if tools:
        request["tools"] = tools
        if tool_choice is not None:
            request["tool_choice"] = tool_choice
        if isinstance(choice, dict) and choice.get("disable_parallel_tool_use") is True:
            request["parallel_tool_calls"] = False
    metadata = payload.get("metadata")
    user = metadata.get("user_id") if isinstance(metadata, dict) else None
    if isinstance(user, str) and user:
        request["user"] = user
    response_format = _response_format(payload)
    if response_format is not None:
        request["response_format"] = response_format
    return request


def carry_over(payload: dict[str, Any], request: dict[str, Any], same_params: tuple[str, ...]) -> None:
    """Into a chat request translated from another shape: the parameters of the same name and
    meaning, and `stream` with the usage chunk, which is what the stream is billed from (as on the
    chat endpoint)."""
    for name in same_params:
        if payload.get(name) is not None:
            request[name] = payload[name]
    if payload.get("stream") is True:
        request["stream"] = True
        request["stream_options"] = {"include_usage": True}


def _response_format(payload: dict[str, Any]) -> dict[str, Any] | None:
    """Structured output (`output_config.format`, or the beta's older `output_format`) as the chat
    shape's `response_format`: the same schema, strict as the family's format always is, under a
    name the chat shape requires."""
    config = payload.get("output_config")
    if config is not None and not isinstance(config, dict):
        raise invalid_request("`output_config` must be an object.", "output_config")
    where = "output_config.format"
    fmt = config.get("format") if isinstance(config, dict) else None
    if fmt is None:
        where, fmt = "output_format", payload.get("output_format")
    if fmt is None:
        return None
    schema = fmt.get("schema") if isinstance(fmt, dict) else None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(schema, dict):
        raise invalid_request(f"`{where}` must be {{type: json_schema, schema: {{...}}}}.", where)
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": schema, "strict": True}}


def _system(system: Any) -> list[dict[str, Any]]:
    if system is None:
        return []
    text = system if isinstance(system, str) else _text_blocks(system, "system")
    return [{"role": "system", "content": text}] if text else []


def _text_blocks(blocks: Any, where: str) -> str:
    """The text of a content that may only be text blocks, joined."""
    if not isinstance(blocks, list):
        raise invalid_request(f"`{where}` must be a string or an array of text blocks.", where)
    texts = []
    for j, block in enumerate(blocks):
        if (
            not isinstance(block, dict)
            or block.get("type") != "text"
            or not isinstance(block.get("text"), str)
        ):
            raise invalid_request(f"`{where}[{j}]` must be a text block here.", f"{where}[{j}]")
        texts.append(block["text"])
    return "\n".join(texts)


def _turn(message: dict[str, Any], where: str) -> list[dict[str, Any]]:
    role, content = message.get("role"), message.get("content")
    if role not in ("user", "assistant"):
        raise invalid_request(f"`{where}.role` must be user or assistant.", f"{where}.role")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise invalid_request(
            f"`{where}.content` must be a string or an array of content blocks.", f"{where}.content"
        )
    blocks = []
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise invalid_request(f"`{where}.content[{j}]` must be a content block.", f"{where}.content[{j}]")
        blocks.append(block)
    where = f"{where}.content"
    return _user_turn(blocks, where) if role == "user" else [_assistant_turn(blocks, where)]


def _user_turn(blocks: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        at, kind = f"{where}[{j}]", block["type"]
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block.get("source"), at)}})
        elif kind == "document":
            parts.extend(_document(block, at))
        elif kind == "tool_result":
            results.append(_tool_message(block, at))
        elif kind == "text":
            raise invalid_request(f"`{at}.text` must be a string.", f"{at}.text")
        else:
            raise invalid_request(
                f"`{at}`: content of type {kind!r} cannot be sent to this model (text, image, document "
                "and tool_result can).",
                at,
            )
    if not parts:
        return results
    if len(parts) == 1 and parts[0]["type"] == "text":
        return [*results, {"role": "user", "content": parts[0]["text"]}]
    return [*results, {"role": "user", "content": parts}]


def _image_url(source: Any, where: str) -> str:
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64" and isinstance(source.get("media_type"), str) and isinstance(source.get("data"), str):
        return f"data:{source['media_type']};base64,{source['data']}"
    if kind == "url" and isinstance(source.get("url"), str):
        return str(source["url"])
    raise invalid_request(f"`{where}.source` must be a base64 or url image source.", f"{where}.source")


def _document(block: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """A document block as chat parts: a base64 PDF as a `file` part (its title as the file's name),
    a text source as a text part, a content source as its text and image parts. A document given by
    URL or by a Files API id has no counterpart: the chat shape takes a file's bytes only."""
    given = block.get("source")
    source: dict[str, Any] = given if isinstance(given, dict) else {}
    kind, at = source.get("type"), f"{where}.source"
    if kind == "base64" and source.get("media_type") == PDF_TYPE and isinstance(source.get("data"), str):
        title = block.get("title")
        name = title if isinstance(title, str) and title else "document.pdf"
        return [
            {
                "type": "file",
                "file": {"filename": name, "file_data": f"data:{PDF_TYPE};base64,{source['data']}"},
            }
        ]
    if kind == "text" and isinstance(source.get("data"), str):
        return [{"type": "text", "text": source["data"]}]
    if kind == "content" and isinstance(source.get("content"), str):
        return [{"type": "text", "text": source["content"]}]
    if kind == "content" and isinstance(source.get("content"), list):
        parts: list[dict[str, Any]] = []
        for j, inner in enumerate(source["content"]):
            inner_kind = inner.get("type") if isinstance(inner, dict) else None
            if inner_kind == "text" and isinstance(inner.get("text"), str):
                parts.append({"type": "text", "text": inner["text"]})
            elif inner_kind == "image":
                url = _image_url(inner.get("source"), f"{at}.content[{j}]")
                parts.append({"type": "image_url", "image_url": {"url": url}})
            else:
                raise invalid_request(
                    f"`{at}.content[{j}]` must be a text or image block.", f"{at}.content[{j}]"
                )
        return parts
    raise invalid_request(
        f"`{at}`: this model takes a document as a base64 PDF, text or content source, not "
        f"{kind or 'this source'} (the chat shape carries a file's bytes only).",
        at,
    )


def _tool_message(block: dict[str, Any], where: str) -> dict[str, Any]:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise invalid_request(f"`{where}.tool_use_id` is required.", f"{where}.tool_use_id")
    content = block.get("content")
    text = (
        content
        if isinstance(content, str)
        else ""
        if content is None
        else _text_blocks(content, f"{where}.content")
    )
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _assistant_turn(blocks: list[dict[str, Any]], where: str) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        at, kind = f"{where}[{j}]", block["type"]
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use":
            call_id, name, tool_input = block.get("id"), block.get("name"), block.get("input", {})
            if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(tool_input, dict):
                raise invalid_request(f"`{at}` needs an id, a name and an input object.", at)
            calls.append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": orjson.dumps(tool_input).decode()},
                }
            )
        elif kind not in UNSAID_BLOCKS:
            raise invalid_request(
                f"`{at}`: content of type {kind!r} cannot be sent to this model (text and tool_use can).", at
            )
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    if calls:
        message["tool_calls"] = calls
    return message


def _tools(tools: Any) -> list[dict[str, Any]]:
    """Client tools as functions. Server tools (web search, code execution and the like, which carry a
    versioned type) have no counterpart and are left out."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise invalid_request("`tools` must be an array.", "tools")
    functions = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise invalid_request(f"`tools[{i}]` must be an object.", f"tools[{i}]")
        if tool.get("type", "custom") != "custom":
            continue
        name, schema = tool.get("name"), tool.get("input_schema")
        if not isinstance(name, str) or not name or not isinstance(schema, dict):
            raise invalid_request(f"`tools[{i}]` needs a name and an input_schema object.", f"tools[{i}]")
        function: dict[str, Any] = {"name": name, "parameters": schema}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        functions.append({"type": "function", "function": function})
    return functions


def _tool_choice(choice: Any) -> Any:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "auto":
        return "auto"
    if kind == "any":
        return "required"
    if kind == "none":
        return "none"
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise invalid_request("`tool_choice.type` must be auto, any, tool (with a name) or none.", "tool_choice")

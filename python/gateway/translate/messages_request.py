"""A chat completions request (Shape A) as the Anthropic Messages request a messages model takes.

The conversation keeps its meaning: system and developer messages become `system`, tool results become
`tool_result` blocks of a user turn, assistant tool calls become `tool_use` blocks, images become
`image` blocks. Parameters without a counterpart are left out (spec 1.3: dropped, not an error); what
cannot be said in the other shape at all (audio, files named by id, legacy function messages) is a 400.
A file given as data becomes a `document` block: a PDF keeps its bytes, a text file (plain, CSV,
Markdown, JSON...) its text.
"""

from __future__ import annotations

from typing import Any

import orjson

from ..errors import invalid_request
from .answers import thinking_block
from .carried import Carried
from .files import PDF_TYPE, read_file_data

# The image types the message family accepts as base64 data.
IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
# The documents it reads: PDFs as base64 data, plain text as text.
TEXT_TYPE = "text/plain"
# Same name and meaning in both shapes; top_k and thinking are the family's own, which a chat client
# may send to it (spec 1.3 example: top_k reaches the family it means something to).
SAME_PARAMS = ("temperature", "top_p", "top_k", "thinking", "stream")
# What messages_request_from_chat carries of a chat request; the rest is dropped (spec 1.3), and
# noted as such (registry.note_dropped).
FROM_CHAT = Carried(
    frozenset(
        {
            "model",
            "messages",
            "max_tokens",
            "max_completion_tokens",
            "response_format",
            "stop",
            "tools",
            "tool_choice",
            "parallel_tool_calls",
            "user",
            "stream_options",
            *SAME_PARAMS,
        }
    ),
    {"stop_sequences": "stop", "metadata": "user", "output_config": "response_format", "system": "messages"},
)
EMPTY_SCHEMA = {"type": "object", "properties": {}}
# What `response_format: {type: json_object}` becomes: the family has no schema-less JSON mode (its
# structured output needs a schema, and an object schema there must close additionalProperties, which
# would force an empty object), so the request is put in words, appended to the system prompt, as
# OpenAI's JSON mode itself wants the prompt to ask for JSON. A best effort, not a guarantee.
JSON_OBJECT_INSTRUCTION = (
    "Respond with a single valid JSON object and nothing else: no prose before or after it, no code fences."
)


def messages_request_from_chat(
    payload: dict[str, Any], default_max_tokens: int, *, image_links: bool = True, thinking: bool = True
) -> dict[str, Any]:
    """`payload` is a chat completions body whose `messages` is a list of objects (checked by the
    route); `default_max_tokens` stands in for the limit the chat shape may leave out. Without
    `image_links` (a provider that takes images only as data), an image link is 400, naming it.
    Without `thinking` (a provider that is not sent the family's `thinking`), an assistant's signed
    thinking blocks are left out."""
    system, turns = _conversation(payload["messages"], image_links, thinking)
    output_format = _output_format(payload.get("response_format"))
    if output_format == "json_object":
        system.append(JSON_OBJECT_INSTRUCTION)
    request: dict[str, Any] = {
        "model": payload.get("model"),
        "messages": turns,
        "max_tokens": _max_tokens(payload, default_max_tokens),
    }
    if system:
        request["system"] = system[0] if len(system) == 1 else [{"type": "text", "text": t} for t in system]
    for name in SAME_PARAMS:
        if payload.get(name) is not None:
            request[name] = payload[name]
    stop = _stop_sequences(payload.get("stop"))
    if stop:
        request["stop_sequences"] = stop
    tools, tool_choice = _tools(payload.get("tools"), payload.get("tool_choice"))
    if tools:
        request["tools"] = tools
        if payload.get("parallel_tool_calls") is False and tool_choice.get("type") != "none":
            tool_choice = {"type": "auto", **tool_choice, "disable_parallel_tool_use": True}
        if tool_choice:
            request["tool_choice"] = tool_choice
    user = payload.get("user")
    if isinstance(user, str) and user:
        request["metadata"] = {"user_id": user}
    if isinstance(output_format, dict):
        request["output_config"] = {"format": output_format}
    return request


def _output_format(response_format: Any) -> dict[str, Any] | str | None:
    """`response_format` as the family's structured output: json_schema becomes
    `output_config.format` ({type: json_schema, schema}; the name, description and strict flag have
    no place there, the family's format is always strict), json_object the string "json_object"
    (an instruction, see JSON_OBJECT_INSTRUCTION), text (or none) None."""
    if response_format is None:
        return None
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return "json_object"
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if isinstance(schema, dict):
            return {"type": "json_schema", "schema": schema}
        raise invalid_request(
            "`response_format.json_schema.schema` must be a JSON schema object.", "response_format"
        )
    raise invalid_request(
        "`response_format.type` must be text, json_object or json_schema.", "response_format"
    )


def _max_tokens(payload: dict[str, Any], default: int) -> int:
    for name in ("max_completion_tokens", "max_tokens"):
        value = payload.get(name)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise invalid_request(f"`{name}` must be a positive integer.", name)
        return value
    return default


def _stop_sequences(stop: Any) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return stop
    raise invalid_request("`stop` must be a string or an array of strings.", "stop")


def _conversation(
    messages: list[dict[str, Any]], image_links: bool, thinking: bool
) -> tuple[list[str], list[dict[str, Any]]]:
    """The system texts and the alternating user/assistant turns (consecutive messages of one role,
    such as the tool results of one turn, are merged into one turn as the message shape wants)."""
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        role = message.get("role")
        if role in ("system", "developer"):
            text = _text(message.get("content"), where)
            if text:
                system.append(text)
            continue
        if role == "user":
            blocks = _user_blocks(message.get("content"), where, image_links)
        elif role == "assistant":
            blocks = _assistant_blocks(message, where, thinking)
        elif role == "tool":
            role, blocks = "user", [_tool_result(message, where)]
        elif role == "function":
            raise invalid_request(
                f"`{where}`: legacy function messages cannot be sent to this model; use tools.", where
            )
        else:
            raise invalid_request(
                f"`{where}.role` must be system, developer, user, assistant or tool.", f"{where}.role"
            )
        if not blocks:
            continue
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    for turn in turns:
        content = turn["content"]
        if len(content) == 1 and content[0]["type"] == "text":
            turn["content"] = content[0]["text"]
    return system, turns


def _text(content: Any, where: str) -> str:
    """The text of a content that may only be text: a string or an array of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise invalid_request(
                    f"`{where}.content[{j}]` must be a text part here.", f"{where}.content[{j}]"
                )
            texts.append(part["text"])
        return "\n".join(texts)
    raise invalid_request(
        f"`{where}.content` must be a string or an array of text parts.", f"{where}.content"
    )


def _user_blocks(content: Any, where: str, image_links: bool) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if not isinstance(content, list):
        raise invalid_request(
            f"`{where}.content` must be a string or an array of content parts.", f"{where}.content"
        )
    blocks: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            if part["text"]:
                blocks.append({"type": "text", "text": part["text"]})
        elif kind == "image_url":
            blocks.append(_image(part.get("image_url"), at, image_links))
        elif kind == "file":
            blocks.append(_document(part.get("file"), at))
        else:
            raise invalid_request(
                f"`{at}`: content of type {kind!r} cannot be sent to this model (text, image_url and "
                "file can).",
                at,
            )
    return blocks


def _base64_data(url: str) -> tuple[str, str] | None:
    """A base64 data: URL's media type (lower case) and data; None for anything else."""
    if not url.startswith("data:"):
        return None
    header, comma, data = url[5:].partition(",")
    media_type, *options = header.split(";")
    return (media_type.strip().lower(), data) if comma and data and "base64" in options else None


def _document(file: Any, where: str) -> dict[str, Any]:
    """A `file` part as a document block. Its `file_data` is a data: URL (or bare base64, taken as
    a PDF, the one kind OpenAI's chat shape reads): a PDF keeps its bytes, plain text becomes a
    text source. A `file_id` names a file kept by OpenAI, which this model cannot read."""
    if not isinstance(file, dict):
        raise invalid_request(f"`{where}.file` must be an object.", f"{where}.file")
    given = file.get("file_data")
    if not isinstance(given, str) or not given:
        if file.get("file_id") is not None:
            raise invalid_request(
                f"`{where}.file.file_id`: a file uploaded to OpenAI cannot be read by this model; send "
                "the file itself as `file_data` (a base64 data: URL).",
                f"{where}.file.file_id",
            )
        raise invalid_request(
            f"`{where}.file.file_data` is required: the file as a base64 data: URL.", f"{where}.file"
        )
    at = f"{where}.file.file_data"
    found = read_file_data(given)
    if found is None:
        raise invalid_request(f"`{at}` must be a data: URL (or base64) of a file that is not empty.", at)
    if found.media_type == PDF_TYPE:
        source: dict[str, Any] = {"type": "base64", "media_type": PDF_TYPE, "data": found.encoded}
    elif found.is_text:  # CSV, Markdown, JSON...: a text document, the one kind of text it takes
        text = found.text()
        if text is None:
            raise invalid_request(f"`{at}` is not text in {found.charset or 'UTF-8'}.", at)
        source = {"type": "text", "media_type": TEXT_TYPE, "data": text}
    else:
        raise invalid_request(
            f"`{at}`: this model reads PDF ({PDF_TYPE}) and text files (text/plain, text/csv, "
            f"text/markdown, application/json...), not {found.media_type}.",
            at,
        )
    block: dict[str, Any] = {"type": "document", "source": source}
    filename = file.get("filename")
    if isinstance(filename, str) and filename:
        block["title"] = filename
    return block


def _image(image_url: Any, where: str, links: bool) -> dict[str, Any]:
    """An image_url part as an image block: a base64 data: URL keeps its bytes, an http(s) URL is
    fetched by the model's provider (where it takes `links`)."""
    url = image_url.get("url") if isinstance(image_url, dict) else image_url
    if isinstance(url, str) and url.startswith(("https://", "http://")):
        if not links:
            raise invalid_request(
                f"`{where}.image_url.url`: this model's provider takes images as base64 data "
                "(data: URLs), not links.",
                where,
            )
        return {"type": "image", "source": {"type": "url", "url": url}}
    given = _base64_data(url) if isinstance(url, str) else None
    if given is not None and given[0] in IMAGE_TYPES:
        return {"type": "image", "source": {"type": "base64", "media_type": given[0], "data": given[1]}}
    raise invalid_request(
        f"`{where}.image_url.url` must be an http(s) URL or a base64 data: URL of a JPEG, PNG, GIF or "
        "WebP image.",
        f"{where}.image_url",
    )


def _assistant_blocks(message: dict[str, Any], where: str, thinking: bool) -> list[dict[str, Any]]:
    if message.get("function_call") is not None:
        raise invalid_request(
            f"`{where}.function_call`: legacy function calls cannot be sent to this model; use tool_calls.",
            f"{where}.function_call",
        )
    blocks = _thinking_blocks(message.get("thinking_blocks"), f"{where}.thinking_blocks") if thinking else []
    content = message.get("content")
    if isinstance(content, list):
        # An assistant's parts are text or refusal parts; both are what it said.
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            text = part.get(kind) if kind in ("text", "refusal") else None
            if not isinstance(text, str):
                raise invalid_request(
                    f"`{where}.content[{j}]` must be a text or refusal part.", f"{where}.content[{j}]"
                )
            if text:
                blocks.append({"type": "text", "text": text})
    elif isinstance(content, str):
        if content:
            blocks.append({"type": "text", "text": content})
    elif content is not None:
        raise invalid_request(f"`{where}.content` must be a string, an array or null.", f"{where}.content")
    tool_calls = message.get("tool_calls")
    if tool_calls is not None:
        if not isinstance(tool_calls, list):
            raise invalid_request(f"`{where}.tool_calls` must be an array.", f"{where}.tool_calls")
        blocks.extend(_tool_use(call, f"{where}.tool_calls[{k}]") for k, call in enumerate(tool_calls))
    return blocks


def _thinking_blocks(given: Any, where: str) -> list[dict[str, Any]]:
    """The signed thinking blocks a chat answer of this family carried (`thinking_blocks`, as
    translate.answers gives them and LiteLLM reads them), first in the assistant's turn, as the
    family wants a tool loop's turns with thinking on."""
    if given is None:
        return []
    if not isinstance(given, list):
        raise invalid_request(f"`{where}` must be an array.", where)
    blocks = []
    for k, block in enumerate(given):
        kept = thinking_block(block) if isinstance(block, dict) else None
        if kept is None:
            raise invalid_request(
                f"`{where}[{k}]` must be a thinking block with its thinking and signature, or a "
                "redacted_thinking block with its data, as the model gave it.",
                f"{where}[{k}]",
            )
        blocks.append(kept)
    return blocks


def _tool_use(call: Any, where: str) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        raise invalid_request(f"`{where}.function` is required.", where)
    call_id, name, arguments = call.get("id"), function.get("name"), function.get("arguments")
    if not isinstance(call_id, str) or not call_id or not isinstance(name, str) or not name:
        raise invalid_request(f"`{where}` needs an id and a function name.", where)
    try:
        tool_input = orjson.loads(arguments) if isinstance(arguments, str) and arguments.strip() else {}
    except orjson.JSONDecodeError:
        tool_input = None
    if not isinstance(tool_input, dict) or not (arguments is None or isinstance(arguments, str)):
        raise invalid_request(
            f"`{where}.function.arguments` must be a JSON object in a string.", f"{where}.function.arguments"
        )
    return {"type": "tool_use", "id": call_id, "name": name, "input": tool_input}


def _tool_result(message: dict[str, Any], where: str) -> dict[str, Any]:
    call_id = message.get("tool_call_id")
    if not isinstance(call_id, str) or not call_id:
        raise invalid_request(f"`{where}.tool_call_id` is required.", f"{where}.tool_call_id")
    return {"type": "tool_result", "tool_use_id": call_id, "content": _text(message.get("content"), where)}


def _tools(tools: Any, choice: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The function tools as the message shape declares them, and the tool choice ({} for the
    model's default). Tools of other kinds (custom grammars) have no counterpart and are left out."""
    if tools is None:
        return [], {}
    if not isinstance(tools, list):
        raise invalid_request("`tools` must be an array.", "tools")
    declared: list[dict[str, Any]] = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise invalid_request(f"`tools[{i}]` must be an object.", f"tools[{i}]")
        if tool.get("type") != "function":
            continue
        function = tool.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(function, dict) or not isinstance(name, str) or not name:
            raise invalid_request(f"`tools[{i}].function.name` is required.", f"tools[{i}].function")
        schema = function.get("parameters", EMPTY_SCHEMA)
        if not isinstance(schema, dict):
            raise invalid_request(
                f"`tools[{i}].function.parameters` must be a JSON schema object.",
                f"tools[{i}].function.parameters",
            )
        entry: dict[str, Any] = {"name": name, "input_schema": schema}
        if isinstance(function.get("description"), str):
            entry["description"] = function["description"]
        declared.append(entry)
    return _tool_choice(declared, choice)


def _tool_choice(tools: list[dict[str, Any]], choice: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    if choice is None:
        return tools, {}
    if choice == "auto":
        return tools, {"type": "auto"}
    if choice == "none":
        return tools, {"type": "none"}
    if choice == "required":
        return tools, {"type": "any"}
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "function":
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if isinstance(name, str) and name:
            return tools, {"type": "tool", "name": name}
    elif kind == "allowed_tools":
        # A subset of the tools, chosen freely (auto) or one of them at least (required).
        allowed = choice.get("allowed_tools")
        listed = allowed.get("tools") if isinstance(allowed, dict) else None
        if isinstance(listed, list) and allowed.get("mode") in ("auto", "required"):
            names = {
                t["function"].get("name")
                for t in listed
                if isinstance(t, dict) and isinstance(t.get("function"), dict)
            }
            subset = [t for t in tools if t["name"] in names]
            return subset, {"type": "any" if allowed["mode"] == "required" else "auto"}
    raise invalid_request(
        '`tool_choice` must be "none", "auto", "required", a function or allowed_tools.', "tool_choice"
    )

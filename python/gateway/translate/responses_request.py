"""A Responses API request (Shape A, `/v1/responses`) as the chat completions request a chat model takes.

`instructions` becomes the first message; `input` items become chat messages: message items by their
role (developer as system), `function_call` items the assistant's tool calls, `function_call_output`
items tool messages. Reasoning items from earlier turns have no place in the chat shape and are left
out, as are hosted tools (web search, file search, ...). What would need state held upstream (a hosted
tool's own call items) or content the chat shape cannot carry (files by URL, audio) is a 400: dropping
it would change what was asked. The route has put the conversation the gateway keeps in place of
`previous_response_id` and `item_reference` items before this runs (routes/kept_responses.py).
"""

from __future__ import annotations

from typing import Any

from ..errors import invalid_request
from .carried import Carried
from .chat_request import carry_over
from .files import read_file_data

# Same name and meaning in both shapes.
SAME_PARAMS = ("temperature", "top_p", "parallel_tool_calls", "user", "top_logprobs")
# What chat_request_from_responses carries of a responses request, or the gateway itself acts on
# for a chat model (store, previous_response_id: routes/kept_responses.py; metadata, echoed on the
# Response); the rest is dropped (spec 1.3), and noted as such (registry.note_dropped).
FROM_RESPONSES = Carried(
    frozenset(
        {
            "model",
            "input",
            "instructions",
            "max_output_tokens",
            "reasoning",
            "text",
            "tools",
            "tool_choice",
            "stream",
            "store",
            "previous_response_id",
            "metadata",
            *SAME_PARAMS,
        }
    ),
    {
        "reasoning_effort": "reasoning",
        "response_format": "text",
        "verbosity": "text",
        "max_completion_tokens": "max_output_tokens",
        "max_tokens": "max_output_tokens",
        "messages": "input",
    },
)
ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
# Input items that carry nothing the chat shape can say, from an earlier turn's output: left out.
UNSAID_ITEMS = frozenset({"reasoning"})


def chat_request_from_responses(payload: dict[str, Any], max_tokens_field: str) -> dict[str, Any]:
    """`payload` is a responses body whose `input` is a string or a list of objects (checked by the
    route). `max_tokens_field` is where max_output_tokens goes: max_completion_tokens, or max_tokens
    for the OpenAI-compatible servers that only know that one."""
    messages: list[dict[str, Any]] = []
    instructions = payload.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise invalid_request("`instructions` must be a string.", "instructions")
        if instructions:
            messages.append({"role": "system", "content": instructions})
    source = payload.get("input")
    if isinstance(source, str):
        messages.append({"role": "user", "content": source})
    else:
        for i, item in enumerate(source or []):
            _add_item(messages, item, f"input[{i}]")
    if not messages:
        raise invalid_request("`input` is empty: there is nothing to answer.", "input")
    request: dict[str, Any] = {"model": payload.get("model"), "messages": messages}
    limit = payload.get("max_output_tokens")
    if limit is not None:
        request[max_tokens_field] = limit
    carry_over(payload, request, SAME_PARAMS)
    reasoning = payload.get("reasoning")
    if isinstance(reasoning, dict) and isinstance(reasoning.get("effort"), str):
        request["reasoning_effort"] = reasoning["effort"]
    text = payload.get("text")
    if text is not None and not isinstance(text, dict):
        raise invalid_request("`text` must be an object.", "text")
    response_format = _response_format(text.get("format") if text else None)
    if response_format is not None:
        request["response_format"] = response_format
    if text and isinstance(text.get("verbosity"), str):
        request["verbosity"] = text["verbosity"]
    tools = _tools(payload.get("tools"))
    choice = _tool_choice(payload.get("tool_choice"))
    if tools:
        request["tools"] = tools
        if choice is not None:
            request["tool_choice"] = choice
    return request


def _add_item(messages: list[dict[str, Any]], item: dict[str, Any], where: str) -> None:
    kind = item.get("type", "message")
    if not isinstance(kind, str):
        raise invalid_request(f"`{where}.type` must be a string.", f"{where}.type")
    if kind == "message":
        messages.append(_message(item, where))
    elif kind == "function_call":
        call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
        if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(arguments, str):
            raise invalid_request(f"`{where}` needs a call_id, a name and arguments (a string).", where)
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        last = messages[-1] if messages else None
        # One assistant turn holds all its calls (and any text said before them), as the chat shape wants.
        if last is not None and last["role"] == "assistant" and "tool_calls" in last:
            last["tool_calls"].append(call)
        elif last is not None and last["role"] == "assistant":
            last["tool_calls"] = [call]
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind == "function_call_output":
        call_id = item.get("call_id")
        if not isinstance(call_id, str) or not call_id:
            raise invalid_request(f"`{where}.call_id` is required.", f"{where}.call_id")
        output = item.get("output")
        text = output if isinstance(output, str) else _text_parts(output, f"{where}.output")
        messages.append({"role": "tool", "tool_call_id": call_id, "content": text})
    elif kind not in UNSAID_ITEMS:
        raise invalid_request(
            f"`{where}`: an item of type {kind!r} cannot be sent to this model (messages, function_call "
            "and function_call_output can; it is a chat model, which holds no state of earlier turns).",
            where,
        )


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    named = item.get("role")
    role = ROLES.get(named) if isinstance(named, str) else None
    if role is None:
        raise invalid_request(
            f"`{where}.role` must be user, assistant, system or developer.", f"{where}.role"
        )
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise invalid_request(
            f"`{where}.content` must be a string or an array of content parts.", f"{where}.content"
        )
    where = f"{where}.content"
    if role != "user":  # assistant and system turns are text in the chat shape
        return {"role": role, "content": _text_parts(content, where)}
    parts = [_user_part(part, f"{where}[{j}]") for j, part in enumerate(content)]
    if len(parts) == 1 and parts[0]["type"] == "text":
        return {"role": "user", "content": parts[0]["text"]}
    return {"role": "user", "content": parts}


def _user_part(part: Any, where: str) -> dict[str, Any]:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in ("input_text", "output_text") and isinstance(part.get("text"), str):
        return {"type": "text", "text": part["text"]}
    if kind == "input_image":
        url = part.get("image_url")
        if not isinstance(url, str) or not url:
            raise invalid_request(
                f"`{where}`: only images given by `image_url` (a URL or a data URL) can be sent to this "
                "model, not uploaded files.",
                where,
            )
        image: dict[str, Any] = {"url": url}
        if isinstance(part.get("detail"), str):
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    if kind == "input_file":
        return _file(part, where)
    raise invalid_request(
        f"`{where}`: content of type {kind!r} cannot be sent to this model (input_text, input_image and "
        "input_file can).",
        where,
    )


def _file(part: dict[str, Any], where: str) -> dict[str, Any]:
    """An input_file as the chat shape's file part: by its data (a base64 data: URL) or by id; a
    text file (text/plain, text/csv, ...) as its text, since the chat shape's file parts are PDFs.
    A file given by URL has no counterpart there (the chat shape carries a file's bytes or id)."""
    given = part.get("file_data")
    if isinstance(given, str) and given:
        found = read_file_data(given)
        if found is None:
            raise invalid_request(
                f"`{where}.file_data` must be a data: URL of a file that is not empty.", where
            )
        if found.is_text:
            text = found.text()
            if text is None:
                raise invalid_request(
                    f"`{where}.file_data` is not text in {found.charset or 'UTF-8'}.", where
                )
            return {"type": "text", "text": text}
    file: dict[str, Any] = {}
    for field in ("file_data", "file_id", "filename"):
        if isinstance(part.get(field), str) and part[field]:
            file[field] = part[field]
    if "file_data" not in file and "file_id" not in file:
        raise invalid_request(
            f"`{where}`: this model takes a file as `file_data` (a base64 data: URL), or by `file_id`"
            " where its provider keeps files, not by URL.",
            where,
        )
    return {"type": "file", "file": file}


def _text_parts(parts: Any, where: str) -> str:
    """The text of content that may only hold text parts (input_text, output_text, refusal), joined."""
    if not isinstance(parts, list):
        raise invalid_request(f"`{where}` must be a string or an array of text parts.", where)
    texts = []
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text") and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
        else:
            raise invalid_request(f"`{where}[{j}]` must be a text part here.", f"{where}[{j}]")
    return "".join(texts)


def _response_format(fmt: Any) -> dict[str, Any] | None:
    """`text.format` as the chat shape's `response_format`: the same schema under the same name."""
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema" and isinstance(fmt.get("schema"), dict) and isinstance(fmt.get("name"), str):
        schema = {k: fmt[k] for k in ("name", "schema", "description", "strict") if fmt.get(k) is not None}
        return {"type": "json_schema", "json_schema": schema}
    raise invalid_request(
        "`text.format` must be {type: text}, {type: json_object} or {type: json_schema, name, schema}.",
        "text.format",
    )


def _tools(tools: Any) -> list[dict[str, Any]]:
    """Function tools as the chat shape's functions. Hosted tools (web_search, file_search,
    code_interpreter, mcp ...) have no counterpart and are left out."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise invalid_request("`tools` must be an array.", "tools")
    functions = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise invalid_request(f"`tools[{i}]` must be an object.", f"tools[{i}]")
        if tool.get("type") != "function":
            continue
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise invalid_request(f"`tools[{i}].name` is required.", f"tools[{i}].name")
        function: dict[str, Any] = {"name": name}
        for key in ("description", "parameters", "strict"):
            if tool.get(key) is not None:
                function[key] = tool[key]
        functions.append({"type": "function", "function": function})
    return functions


def _tool_choice(choice: Any) -> Any:
    """ "auto", "none", "required" as they are; a named function in the chat shape's form. A hosted
    tool's choice (its tool left out) leaves the choice to the model."""
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    if isinstance(choice, dict) and isinstance(choice.get("type"), str):
        return None
    raise invalid_request(
        "`tool_choice` must be auto, none, required or {type: function, name}.", "tool_choice"
    )

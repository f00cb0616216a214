"""AWS Bedrock through its Converse API: chat models of every family Bedrock hosts (Anthropic,
Meta, Mistral, Amazon ...), one wire format for all of them.

A chat completions request is said as a Converse request (the conversation as the messages shape
says it, gateway.translate, then in Converse's blocks), signed with SigV4 (sigv4.py) for the
channel's region; the answer comes back as a chat completion and ConverseStream's binary event
stream (parsed in the Rust core) as chat completion chunks, so everything after the provider is
the chat shape's own: ids, usage, billing, translation to the messages shape.

  POST {base_url}/model/{model}/converse          POST {base_url}/model/{model}/converse-stream

Usage is Converse's: inputTokens (plus cache reads and writes) is the prompt, outputTokens the
completion. Stop reasons: end_turn and stop_sequence are "stop", max_tokens "length", tool_use
"tool_calls", guardrail_intervened and content_filtered "content_filter". Errors are Bedrock's
(`{"message": ...}` with its HTTP status): 429 ThrottlingException is provider_overloaded, 5xx fail
over, 400 ValidationException is invalid_request; an exception inside a stream ends it as the
chat shape's error event.
"""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import quote

import orjson

from ..config import ChannelConfig
from ..core import EventStreamParser, InvalidEventStreamError
from ..errors import GatewayError, invalid_request
from ..translate import messages_request_from_chat
from ..translate.chat_wire import ChatChunks, usage_object
from ..translate.usage import token_count
from . import sigv4
from .http import UpstreamClient

# The chat completions parameters Converse has a counterpart for (spec 1.3 default list).
PARAMS: Final = {
    "chat": frozenset(
        {
            "max_tokens",
            "max_completion_tokens",
            "temperature",
            "top_p",
            "stop",
            "tools",
            "tool_choice",
            "parallel_tool_calls",
            "stream",
            "stream_options",
            "response_format",
        }
    )
}
PARAMS_BY_MODEL: Final[dict[tuple[str, str], frozenset[str]]] = {}
PATHS: Final = {"chat": "/converse"}
SERVICE = "bedrock"
STOP_REASONS: Final = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "guardrail_intervened": "content_filter",
    "content_filtered": "content_filter",
}
IMAGE_FORMATS: Final = {"image/jpeg": "jpeg", "image/png": "png", "image/gif": "gif", "image/webp": "webp"}


def url(channel: ChannelConfig, model_type: str, *, stream: bool = False) -> str:
    action = "converse-stream" if stream else "converse"
    return f"{channel.base_url}/model/{quote(channel.upstream_model, safe='')}/{action}"


async def headers(
    channel: ChannelConfig,
    client_headers: Mapping[str, str],
    upstream: UpstreamClient,
    *,
    url: str = "",
    body: bytes = b"",
) -> dict[str, str]:
    creds = sigv4.credentials(channel.aws_profile)
    if creds is None:
        raise GatewayError(
            "provider_error",
            "The gateway has no AWS credentials for the model's provider (the environment's or a profile's).",
            retry="other",
        )
    base = {"content-type": "application/json", "accept": "application/json"}
    return sigv4.sign("POST", url, base, body, creds, channel.region or "us-east-1", SERVICE)


# ------------------------------------------------------------------ the request


def _text_format(response_format: Any) -> dict[str, Any] | None:
    """`response_format` as Converse's structured output (`outputConfig.textFormat`): the JSON
    Schema travels as a string. Converse has no schema-less JSON mode: `json_object` asks for any
    object. `text`, or none, is Converse's default."""
    if not isinstance(response_format, dict):
        return None
    kind = response_format.get("type")
    if kind == "json_object":
        definition: dict[str, Any] = {"schema": '{"type":"object"}'}
    elif kind == "json_schema":
        given = response_format.get("json_schema")
        spec: dict[str, Any] = given if isinstance(given, dict) else {}
        schema = spec.get("schema")
        if not isinstance(schema, dict):
            raise invalid_request(
                "`response_format.json_schema.schema` must be a JSON Schema object.", "response_format"
            )
        definition = {"schema": orjson.dumps(schema).decode()}
        for field in ("name", "description"):
            if isinstance(spec.get(field), str):
                definition[field] = spec[field]
    else:
        return None
    return {"type": "json_schema", "structure": {"jsonSchema": definition}}


def encode(channel: ChannelConfig, operation: str, body: bytes) -> bytes:
    """A chat completions body as a Converse request."""
    payload = orjson.loads(body)
    said, turns = _said(payload)
    request: dict[str, Any] = {"messages": turns}
    system = said.get("system")
    if isinstance(system, str):
        request["system"] = [{"text": system}]
    elif isinstance(system, list):
        request["system"] = [{"text": b["text"]} for b in system]
    inference: dict[str, Any] = {}
    if payload.get("max_completion_tokens") is not None or payload.get("max_tokens") is not None:
        inference["maxTokens"] = said["max_tokens"]
    for ours, theirs in (("temperature", "temperature"), ("top_p", "topP")):
        if said.get(ours) is not None:
            inference[theirs] = said[ours]
    if said.get("stop_sequences"):
        inference["stopSequences"] = said["stop_sequences"]
    if inference:
        request["inferenceConfig"] = inference
    text_format = _text_format(payload.get("response_format"))
    if text_format is not None:
        request["outputConfig"] = {"textFormat": text_format}
    choice = said.get("tool_choice", {})
    tools = [] if choice.get("type") == "none" else said.get("tools") or []
    used = _tools_used(said["messages"])
    if used and not tools:
        # Converse refuses toolUse and toolResult blocks without a toolConfig: a conversation that
        # has them declares tools, even when the client sends none (a tool loop's last, prose
        # turn) or says "none", which Converse has no word for.
        tools = said.get("tools") or used
    if tools:
        config: dict[str, Any] = {
            "tools": [
                {
                    "toolSpec": {
                        "name": t["name"],
                        **({"description": t["description"]} if "description" in t else {}),
                        "inputSchema": {"json": t["input_schema"]},
                    }
                }
                for t in tools
            ]
        }
        if choice.get("type") == "any":
            config["toolChoice"] = {"any": {}}
        elif choice.get("type") == "tool":
            config["toolChoice"] = {"tool": {"name": choice["name"]}}
        request["toolConfig"] = config
    return orjson.dumps(request)


def _said(payload: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The chat request as a message request, and its turns as Converse's messages (a 400 for what
    Converse has no counterpart for)."""
    said = messages_request_from_chat(payload, 0, image_links=False, thinking=False)
    turns = [_turn(t, i) for i, t in enumerate(said["messages"])]
    _name_documents(turns)
    return said, turns


def check(model_type: str, payload: dict[str, Any]) -> None:
    """A chat request Converse cannot be asked is refused before it is held (encode would refuse it
    only when it is sent: after the hold, which may refuse it first for another reason)."""
    if model_type == "chat":
        _said(payload)


# What a tool result that says nothing is sent as (Converse refuses blank text).
EMPTY_RESULT: Final = "(no output)"
# Converse's document names: letters, digits, single spaces, hyphens, parentheses and brackets;
# at most 200 characters, each name once in a request.
NAME_REFUSED: Final = re.compile(r"[^A-Za-z0-9\-()\[\] ]+| {2,}")
MAX_NAME_CHARS: Final = 200
# What a user turn holding documents and no text says beside them: Converse refuses documents
# without a text block in their message.
DOCUMENT_TEXT: Final = "(see the attached document)"
# The tool declared for a conversation with tool results but no calls (their calls cut from it).
UNNAMED_TOOL: Final = "tool"


def _tools_used(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tools a conversation's calls name, each declared as taking any object; none when it has
    no tool blocks (a result's tool is named by its call)."""
    names: dict[str, None] = {}
    results = False
    for turn in turns:
        content = turn["content"]
        for block in content if isinstance(content, list) else []:
            if block.get("type") == "tool_use":
                names[block["name"]] = None
            results = results or block.get("type") == "tool_result"
    if results and not names:
        names[UNNAMED_TOOL] = None
    return [{"name": name, "input_schema": {"type": "object"}} for name in names]


def _turn(turn: dict[str, Any], index: int) -> dict[str, Any]:
    content = turn["content"]
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
    said = [_block(b, index) for b in blocks]
    if any("document" in b for b in said) and not any("text" in b for b in said):
        said.append({"text": DOCUMENT_TEXT})
    return {"role": turn["role"], "content": said}


def _name_documents(turns: list[dict[str, Any]]) -> None:
    """Each document's name once in the request (Converse refuses a name twice: two untitled files,
    or one file sent again in a later turn), within Converse's length."""
    taken: set[str] = set()
    for turn in turns:
        for block in turn["content"]:
            document = block.get("document")
            if document is None:
                continue
            base = document["name"][: MAX_NAME_CHARS - 8].strip() or "document"
            name, n = base, 1
            while name in taken:
                n += 1
                name = f"{base} ({n})"
            taken.add(name)
            document["name"] = name


def _block(block: dict[str, Any], index: int) -> dict[str, Any]:
    kind = block.get("type")
    if kind == "text":
        return {"text": block["text"]}
    if kind == "tool_use":
        return {"toolUse": {"toolUseId": block["id"], "name": block["name"], "input": block["input"]}}
    if kind == "tool_result":
        content = block.get("content")
        text = content if isinstance(content, str) else orjson.dumps(content).decode() if content else ""
        if not text.strip():  # Converse refuses a blank text block, and a tool may return nothing
            text = EMPTY_RESULT
        return {"toolResult": {"toolUseId": block["tool_use_id"], "content": [{"text": text}]}}
    if kind == "image":
        source = block.get("source", {})
        image_format = IMAGE_FORMATS.get(source.get("media_type", ""))
        if source.get("type") == "base64" and image_format is not None:
            return {"image": {"format": image_format, "source": {"bytes": source["data"]}}}
        raise invalid_request(
            "Bedrock takes images as base64 data (data: URLs), not links.", f"messages[{index}].content"
        )
    if kind == "document":  # a PDF's bytes or a text (messages_request_from_chat makes no other)
        source = block["source"]
        title = NAME_REFUSED.sub(" ", block.get("title", "")).strip()
        document: dict[str, Any] = {"name": title or "document"}
        if source["type"] == "text":
            document |= {
                "format": "txt",
                "source": {"bytes": base64.b64encode(source["data"].encode()).decode()},
            }
        else:
            document |= {"format": "pdf", "source": {"bytes": source["data"]}}
        return {"document": document}
    raise invalid_request(
        f"Bedrock has no counterpart for this content ({kind}).", f"messages[{index}].content"
    )


# ------------------------------------------------------------------ the answer


def decode(channel: ChannelConfig, operation: str, content: bytes, request: bytes) -> bytes:
    """A Converse answer as a chat completion."""
    try:
        answer = orjson.loads(content)
        blocks = answer["output"]["message"]["content"]
        stop = answer.get("stopReason")
        usage = _usage(answer.get("usage"))
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise GatewayError("provider_error", "The model's provider sent a malformed answer.") from exc
    text, reasoning, calls = [], [], []
    for block in blocks if isinstance(blocks, list) else []:
        if not isinstance(block, dict):
            continue
        if isinstance(block.get("text"), str):
            text.append(block["text"])
        elif isinstance(block.get("toolUse"), dict):
            use = block["toolUse"]
            arguments = orjson.dumps(use.get("input", {})).decode()
            calls.append(
                {
                    "id": use.get("toolUseId"),
                    "type": "function",
                    "function": {"name": use.get("name"), "arguments": arguments},
                }
            )
        elif isinstance(block.get("reasoningContent"), dict):
            said = block["reasoningContent"].get("reasoningText")
            if isinstance(said, dict) and isinstance(said.get("text"), str):
                reasoning.append(said["text"])
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text) if text or not calls else None}
    if calls:
        message["tool_calls"] = calls
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    completion = {
        "id": "",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": channel.upstream_model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": _finish(stop)}],
        "usage": usage,
    }
    return orjson.dumps(completion)


def _finish(stop: Any) -> str:
    return STOP_REASONS.get(stop, "stop") if isinstance(stop, str) else "stop"


def _usage(usage: Any) -> dict[str, Any] | None:
    if not isinstance(usage, dict):
        return None
    count = {name: token_count(value) for name, value in usage.items()}
    cached, written = count.get("cacheReadInputTokens", 0), count.get("cacheWriteInputTokens", 0)
    prompt = count.get("inputTokens", 0) + cached + written
    return usage_object(prompt, count.get("outputTokens", 0), cached, cache_write=written)


# ------------------------------------------------------------------ the stream


class ConverseStreamToChat:
    """ConverseStream's event stream as chat completion chunks (SSE), for the chat rewriter."""

    def __init__(self, model: str) -> None:
        self.parser = EventStreamParser()
        self.out = ChatChunks(model)
        self.tools: dict[int, int] = {}  # content block index -> tool call index
        self.broken = False

    def feed(self, chunk: bytes) -> bytes:
        if self.broken:
            return b""
        try:
            messages = self.parser.feed(chunk)
        except InvalidEventStreamError as exc:
            self.broken = True
            return self.out.error(str(exc), "streamError")
        return b"".join(
            self._event(
                m.header(":message-type"), m.header(":event-type"), m.header(":exception-type"), m.payload
            )
            for m in messages
        )

    def finish(self) -> bytes:
        if self.broken:
            return b""
        try:
            self.parser.finish()
        except InvalidEventStreamError as exc:
            return self.out.error(str(exc), "streamError")
        return b""

    def _tool(self, block: Any) -> int:
        """The tool call index of a content block."""
        return self.tools.setdefault(block if isinstance(block, int) else 0, len(self.tools))

    def _event(
        self, message_type: str | None, event: str | None, exception: str | None, payload: bytes
    ) -> bytes:
        try:
            data = orjson.loads(payload) if payload else {}
        except orjson.JSONDecodeError:
            data = {}
        if not isinstance(data, dict):
            data = {}
        if message_type != "event":
            said = data.get("message")
            message = said if isinstance(said, str) else "The model failed."
            return self.out.error(message, exception or "modelStreamErrorException")
        if event == "messageStart":  # the role goes with the first output (ChatChunks.delta)
            return b""
        if event == "contentBlockStart":
            use = (data.get("start") or {}).get("toolUse")
            if not isinstance(use, dict):
                return b""
            call = {
                "index": self._tool(data.get("contentBlockIndex")),
                "id": use.get("toolUseId"),
                "type": "function",
            }
            return self.out.delta(
                {"tool_calls": [{**call, "function": {"name": use.get("name"), "arguments": ""}}]}
            )
        if event == "contentBlockDelta":
            delta = data.get("delta") or {}
            if isinstance(delta.get("text"), str):
                return self.out.delta({"content": delta["text"]})
            use = delta.get("toolUse")
            if isinstance(use, dict) and isinstance(use.get("input"), str):
                index = self._tool(data.get("contentBlockIndex"))
                return self.out.delta(
                    {"tool_calls": [{"index": index, "function": {"arguments": use["input"]}}]}
                )
            thought = delta.get("reasoningContent")
            if isinstance(thought, dict) and isinstance(thought.get("text"), str):
                return self.out.delta({"reasoning_content": thought["text"]})
            return b""
        if event == "messageStop":
            return self.out.delta({}, _finish(data.get("stopReason")))
        if event == "metadata":
            return self.out.usage_and_done(_usage(data.get("usage")))
        return b""  # contentBlockStop, and events this gateway does not read


def stream_translator(channel: ChannelConfig, operation: str) -> ConverseStreamToChat:
    return ConverseStreamToChat(channel.upstream_model)

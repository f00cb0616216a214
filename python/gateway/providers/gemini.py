"""Google Gemini through the Generative Language API: chat models, plain and streamed.

A chat completions request is said as `generateContent` (the conversation through the messages
translation, gateway.translate, then in Gemini's parts: user and model turns, `systemInstruction`,
`generationConfig`, with `response_format` as JSON output held to the client's schema, function
declarations and `toolConfig`); the answer comes back as a chat
completion and `streamGenerateContent?alt=sse` as chat completion chunks, so everything after the
provider is the chat shape's own.

  POST {base_url}/v1beta/models/{model}:generateContent        (header x-goog-api-key)
  POST {base_url}/v1beta/models/{model}:streamGenerateContent?alt=sse

Usage from `usageMetadata`: promptTokenCount is the prompt (cachedContentTokenCount of it cached),
candidatesTokenCount plus thoughtsTokenCount the completion (thinking is billed as output, as
Google bills it; thoughtsTokenCount is also reasoning_tokens). Finish reasons: STOP is "stop" (or
"tool_calls" with function calls), MAX_TOKENS "length", SAFETY, RECITATION, BLOCKLIST,
PROHIBITED_CONTENT and SPII "content_filter". A prompt Gemini blocks (promptFeedback.blockReason,
no candidates; streamed, the stream's one event) is content_filtered. Function tools go as
parametersJsonSchema (JSON Schema whole); a call's thoughtSignature rides in its id
(THOUGHT_SEPARATOR) and goes back on its functionCall part. Errors are Google's (`{"error":
{"code", "message", "status"}}`): 429 RESOURCE_EXHAUSTED (or a stream's first event saying it) is
provider_overloaded; an invalid API key (400 API_KEY_INVALID) is the gateway's fault,
provider_error.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import quote

import orjson

from ..config import ChannelConfig
from ..core import SseParser
from ..errors import GatewayError, invalid_request
from ..translate import messages_request_from_chat
from ..translate.chat_wire import ChatChunks, usage_object
from ..translate.usage import token_count
from .embeddings_wire import embedding_list, input_texts
from .http import UpstreamClient

PARAMS: Final = {
    "chat": frozenset(
        {
            "max_tokens",
            "max_completion_tokens",
            "temperature",
            "top_p",
            "top_k",
            "stop",
            "tools",
            "tool_choice",
            "stream",
            "stream_options",
            "seed",
            "presence_penalty",
            "frequency_penalty",
            "response_format",
        }
    ),
    "embedding": frozenset({"dimensions", "encoding_format"}),
}
PARAMS_BY_MODEL: Final[dict[tuple[str, str], frozenset[str]]] = {}
PATHS: Final = {"chat": ":generateContent", "embedding": ":batchEmbedContents"}
API_VERSION = "v1beta"
FINISH_REASONS: Final = {
    "STOP": "stop",
    "MAX_TOKENS": "length",
    "SAFETY": "content_filter",
    "RECITATION": "content_filter",
    "BLOCKLIST": "content_filter",
    "PROHIBITED_CONTENT": "content_filter",
    "SPII": "content_filter",
    "IMAGE_SAFETY": "content_filter",
}
# The error code a stream's blocked prompt ends on: OpenAI's code for a filtered prompt, which
# providers.base.content_refusal knows.
BLOCKED_PROMPT: Final = "content_filter"
IMAGE_TYPES: Final = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp", "image/heic"})


def url(channel: ChannelConfig, model_type: str, *, stream: bool = False) -> str:
    model = quote(channel.upstream_model, safe="")
    if model_type == "embedding":
        return f"{channel.base_url}/{API_VERSION}/models/{model}:batchEmbedContents"
    action = "streamGenerateContent?alt=sse" if stream else "generateContent"
    return f"{channel.base_url}/{API_VERSION}/models/{model}:{action}"


async def headers(
    channel: ChannelConfig,
    client_headers: Mapping[str, str],
    upstream: UpstreamClient,
    *,
    url: str = "",
    body: bytes = b"",
) -> dict[str, str]:
    out = {"content-type": "application/json", "accept": "application/json"}
    key = channel.api_key()
    if key:
        out["x-goog-api-key"] = key
    return out


# ------------------------------------------------------------------ the request


def encode(channel: ChannelConfig, operation: str, body: bytes) -> bytes:
    """A chat completions body as a generateContent request, an embeddings one as
    batchEmbedContents."""
    payload = orjson.loads(body)
    if operation == "embedding":
        return _embed_request(channel, payload)
    said, contents = _said(payload)
    request: dict[str, Any] = {"contents": contents}
    system = said.get("system")
    if isinstance(system, list):
        system = "\n\n".join(b["text"] for b in system)
    if system:
        request["systemInstruction"] = {"parts": [{"text": system}]}
    config: dict[str, Any] = {}
    if payload.get("max_completion_tokens") is not None or payload.get("max_tokens") is not None:
        config["maxOutputTokens"] = said["max_tokens"]
    for ours, theirs in (
        ("temperature", "temperature"),
        ("top_p", "topP"),
        ("top_k", "topK"),
        ("seed", "seed"),
        ("presence_penalty", "presencePenalty"),
        ("frequency_penalty", "frequencyPenalty"),
    ):
        if payload.get(ours) is not None:
            config[theirs] = payload[ours]
    if said.get("stop_sequences"):
        config["stopSequences"] = said["stop_sequences"]
    config.update(_json_output(payload.get("response_format")))
    if config:
        request["generationConfig"] = config
    tools = said.get("tools")
    choice = said.get("tool_choice", {})
    if tools:
        request["tools"] = [
            {
                "functionDeclarations": [
                    {
                        "name": t["name"],
                        **({"description": t["description"]} if "description" in t else {}),
                        # JSON Schema as the client wrote it (additionalProperties, $ref, anyOf
                        # ...): `parameters` takes only Google's OpenAPI subset of it.
                        "parametersJsonSchema": t["input_schema"],
                    }
                    for t in tools
                ]
            }
        ]
        kind = choice.get("type")
        if kind == "none":
            request["toolConfig"] = {"functionCallingConfig": {"mode": "NONE"}}
        elif kind == "any":
            request["toolConfig"] = {"functionCallingConfig": {"mode": "ANY"}}
        elif kind == "tool":
            request["toolConfig"] = {
                "functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": [choice["name"]]}
            }
    return orjson.dumps(request)


def _said(payload: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The chat request as a message request, and its turns as Gemini's contents (a 400 for what
    Gemini has no counterpart for)."""
    said = messages_request_from_chat(payload, 0, image_links=False, thinking=False)
    names: dict[str, str] = {}  # tool call id -> function name (a function response names it)
    signatures = _given_signatures(payload["messages"])
    return said, [_content(t, i, names, signatures) for i, t in enumerate(said["messages"])]


def check(model_type: str, payload: dict[str, Any]) -> None:
    """A chat request Gemini cannot be asked is refused before it is held (encode would refuse it
    only when it is sent: after the hold, which may refuse it first for another reason)."""
    if model_type == "chat":
        _said(payload)


def _json_output(response_format: Any) -> dict[str, Any]:
    """`response_format` as Gemini's generationConfig says it: JSON output (`responseMimeType`),
    held to the client's JSON Schema whole (`responseJsonSchema`; `responseSchema` takes only
    Google's OpenAPI subset). `text`, or none, is Gemini's default."""
    if not isinstance(response_format, dict):
        return {}
    kind = response_format.get("type")
    if kind == "json_object":
        return {"responseMimeType": "application/json"}
    if kind != "json_schema":
        return {}
    spec = response_format.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(schema, dict):
        raise invalid_request(
            "`response_format.json_schema.schema` must be a JSON Schema object.", "response_format"
        )
    return {"responseMimeType": "application/json", "responseJsonSchema": schema}


def _given_signatures(messages: list[Any]) -> dict[str, str]:
    """Tool call id -> thought signature, as Google's OpenAI-compatible API carries it
    (`tool_calls[].extra_content.google.thought_signature`; clients that know Gemini, as the
    Agents SDK, send it back there, and take THOUGHT_SEPARATOR's part off the id)."""
    found: dict[str, str] = {}
    for message in messages:
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        for call in calls if isinstance(calls, list) else []:
            extra = call.get("extra_content") if isinstance(call, dict) else None
            google = extra.get("google") if isinstance(extra, dict) else None
            signature = google.get("thought_signature") if isinstance(google, dict) else None
            if isinstance(signature, str) and signature and isinstance(call.get("id"), str):
                found[call["id"]] = signature
    return found


def _content(
    turn: dict[str, Any], index: int, names: dict[str, str], signatures: dict[str, str]
) -> dict[str, Any]:
    blocks = turn["content"]
    if isinstance(blocks, str):
        blocks = [{"type": "text", "text": blocks}]
    return {
        "role": "model" if turn["role"] == "assistant" else "user",
        "parts": [_part(b, index, names, signatures) for b in blocks],
    }


def _part(
    block: dict[str, Any], index: int, names: dict[str, str], signatures: dict[str, str]
) -> dict[str, Any]:
    kind = block.get("type")
    if kind == "text":
        return {"text": block["text"]}
    if kind == "tool_use":
        names[block["id"]] = block["name"]
        part: dict[str, Any] = {"functionCall": {"name": block["name"], "args": block["input"]}}
        signature = signatures.get(block["id"]) or _thought_signature(block["id"])
        if signature:
            part["thoughtSignature"] = signature
        return part
    if kind == "tool_result":
        content = block.get("content")
        text = content if isinstance(content, str) else orjson.dumps(content).decode()
        name = names.get(block["tool_use_id"], block["tool_use_id"])
        return {"functionResponse": {"name": name, "response": {"content": text}}}
    if kind == "image":
        source = block.get("source", {})
        if source.get("type") == "base64" and source.get("media_type") in IMAGE_TYPES:
            return {"inlineData": {"mimeType": source["media_type"], "data": source["data"]}}
        raise invalid_request(
            "Gemini takes images as base64 data (data: URLs), not links.", f"messages[{index}].content"
        )
    if kind == "document":  # a PDF's bytes or a text (messages_request_from_chat makes no other)
        source = block["source"]
        if source["type"] == "text":
            return {"text": source["data"]}
        return {"inlineData": {"mimeType": "application/pdf", "data": source["data"]}}
    raise invalid_request(
        f"Gemini has no counterpart for this content ({kind}).", f"messages[{index}].content"
    )


# ------------------------------------------------------------------ the answer


def decode(channel: ChannelConfig, operation: str, content: bytes, request: bytes) -> bytes:
    """A generateContent answer as a chat completion, batchEmbedContents' as OpenAI's embeddings."""
    if operation == "embedding":
        return _embeddings(channel, content, request)
    try:
        answer = orjson.loads(content)
        candidates = answer.get("candidates")
    except (orjson.JSONDecodeError, AttributeError) as exc:
        raise GatewayError("provider_error", "The model's provider sent a malformed answer.") from exc
    if not candidates:
        blocked = (answer.get("promptFeedback") or {}).get("blockReason")
        if blocked:
            raise GatewayError(
                "content_filtered",
                f"The model's provider refused the request under its content policy: {blocked}.",
            )
        raise GatewayError("provider_error", "The model's provider sent no answer.")
    candidate = candidates[0] if isinstance(candidates[0], dict) else {}
    text, thoughts, calls = _parts(candidate)
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text) if text or not calls else None}
    if calls:
        message["tool_calls"] = calls
    if thoughts:
        message["reasoning_content"] = "".join(thoughts)
    completion = {
        "id": "",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": answer.get("modelVersion") or channel.upstream_model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": _finish(candidate.get("finishReason"), bool(calls)),
            }
        ],
        "usage": _usage(answer.get("usageMetadata")),
    }
    return orjson.dumps(completion)


def _parts(candidate: dict[str, Any]) -> tuple[list[str], list[str], list[dict[str, Any]]]:
    """The answer's text, its thoughts, and its function calls (as chat tool calls)."""
    parts = (candidate.get("content") or {}).get("parts")
    text: list[str] = []
    thoughts: list[str] = []
    calls: list[dict[str, Any]] = []
    for part in parts if isinstance(parts, list) else []:
        if not isinstance(part, dict):
            continue
        if isinstance(part.get("text"), str):
            (thoughts if part.get("thought") is True else text).append(part["text"])
        elif isinstance(part.get("functionCall"), dict):
            call = part["functionCall"]
            arguments = orjson.dumps(call.get("args") or {}).decode()
            signature = part.get("thoughtSignature")
            entry: dict[str, Any] = {
                "id": _call_id(call.get("id"), signature),
                "type": "function",
                "function": {"name": call.get("name"), "arguments": arguments},
            }
            if isinstance(signature, str) and signature:
                # Also where Google's OpenAI-compatible API puts it, for the clients that look there.
                entry["extra_content"] = {"google": {"thought_signature": signature}}
            calls.append(entry)
    return text, thoughts, calls


# A function call's thought signature (Gemini's opaque record of the thinking that led to it, which
# it requires back with the call in the conversation's current turn) travels in the call's id: the
# one field every client returns unchanged, in every shape. LiteLLM's separator, so that ids from
# either gateway read the same; the signature URL-safe (ids stay [A-Za-z0-9_-]), unpadded.
THOUGHT_SEPARATOR: Final = "__thought__"


def _call_id(given: Any, signature: Any) -> str:
    """A call's id, unique (Gemini's calls usually carry none, and two identical calls in one
    answer must not share one), with its thought signature when it has one."""
    base = given if isinstance(given, str) and given else "call_" + secrets.token_hex(12)
    if not isinstance(signature, str) or not signature:
        return base
    return base + THOUGHT_SEPARATOR + signature.replace("+", "-").replace("/", "_").rstrip("=")


def _thought_signature(call_id: str) -> str | None:
    """The signature _call_id put in a call's id, in standard base64 again; None without one."""
    _, found, signature = call_id.partition(THOUGHT_SEPARATOR)
    if not found or not signature:
        return None
    signature = signature.replace("-", "+").replace("_", "/")
    return signature + "=" * (-len(signature) % 4)


def _finish(reason: Any, called: bool) -> str | None:
    if not isinstance(reason, str):
        return None
    if reason == "STOP" and called:
        return "tool_calls"
    return FINISH_REASONS.get(reason, "stop")


def _usage(metadata: Any) -> dict[str, Any] | None:
    if not isinstance(metadata, dict):
        return None
    count = {name: token_count(value) for name, value in metadata.items()}
    thoughts = count.get("thoughtsTokenCount", 0)
    return usage_object(
        count.get("promptTokenCount", 0),
        count.get("candidatesTokenCount", 0) + thoughts,
        cached=count.get("cachedContentTokenCount", 0),
        reasoning=thoughts,
    )


# ------------------------------------------------------------------ embeddings


def _embed_request(channel: ChannelConfig, payload: dict[str, Any]) -> bytes:
    """OpenAI's embeddings body (texts; Gemini takes no token arrays) as batchEmbedContents."""
    texts = input_texts(payload, "Gemini")
    dimensions = payload.get("dimensions")
    requests = [
        {
            "model": f"models/{channel.upstream_model}",
            "content": {"parts": [{"text": text}]},
            **({"outputDimensionality": dimensions} if isinstance(dimensions, int) else {}),
        }
        for text in texts
    ]
    return orjson.dumps({"requests": requests})


def _embeddings(channel: ChannelConfig, content: bytes, request: bytes) -> bytes:
    """batchEmbedContents' answer as OpenAI's, floats or base64 as the request asked; no usage
    (Gemini reports none: the gateway counts the input)."""
    try:
        vectors = [e["values"] for e in orjson.loads(content)["embeddings"]]
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise GatewayError("provider_error", "The model's provider sent a malformed answer.") from exc
    return embedding_list(vectors, request, channel.upstream_model)


# ------------------------------------------------------------------ the stream


class GeminiStreamToChat:
    """streamGenerateContent's server-sent events as chat completion chunks."""

    def __init__(self, model: str) -> None:
        self.parser = SseParser()
        self.out = ChatChunks(model)
        self.calls = 0
        self.done = False

    def feed(self, chunk: bytes) -> bytes:
        return b"".join(self._event(e.data) for e in self.parser.feed(chunk))

    def finish(self) -> bytes:
        return b"".join(self._event(e.data) for e in self.parser.finish())

    def _event(self, data: str) -> bytes:
        if self.done:
            return b""
        try:
            answer = orjson.loads(data)
        except orjson.JSONDecodeError:
            answer = None
        if not isinstance(answer, dict):
            return self._error("The model's provider sent a malformed event.")
        if isinstance(answer.get("error"), dict):
            error = answer["error"]
            status = error.get("status")  # RESOURCE_EXHAUSTED: the provider at capacity
            return self._error(
                str(error.get("message") or "The model failed."), status if isinstance(status, str) else None
            )
        out = b""
        candidates = answer.get("candidates")
        if not candidates:
            blocked = (answer.get("promptFeedback") or {}).get("blockReason")
            if not blocked:
                return out
            # Before the first token: content_filtered, as the same block is on a plain request.
            return out + self._error(f"The prompt was blocked: {blocked}.", BLOCKED_PROMPT)
        candidate = candidates[0] if isinstance(candidates[0], dict) else {}
        text, thoughts, calls = _parts(candidate)
        finish = _finish(candidate.get("finishReason"), self.calls + len(calls) > 0)
        for thought in thoughts:
            out += self.out.delta({"reasoning_content": thought})
        for piece in text:
            out += self.out.delta({"content": piece})
        for call in calls:
            out += self.out.delta({"tool_calls": [{"index": self.calls, **call}]})
            self.calls += 1
        if finish is not None:
            out += self.out.delta({}, finish) + self.out.usage_and_done(_usage(answer.get("usageMetadata")))
            self.done = True
        return out

    def _error(self, message: str, code: str | None = None) -> bytes:
        self.done = True
        return self.out.error(message, code=code)


def stream_translator(channel: ChannelConfig, operation: str) -> GeminiStreamToChat:
    return GeminiStreamToChat(channel.upstream_model)

"""Google's Generative Language API (Gemini): generateContent and streamGenerateContent.

  POST /{version}/models/{model}:generateContent          (x-goog-api-key header, or ?key=)
  POST /{version}/models/{model}:streamGenerateContent?alt=sse

A request without a key is 403 PERMISSION_DENIED, with the key "invalid" 400 API_KEY_INVALID, as
Google answers. Bodies are Gemini's (contents of user and model turns made of parts,
systemInstruction, generationConfig, function declarations and toolConfig); answers carry
candidates, finishReason and usageMetadata (thinking, with the directive `reasoning=N`, as thought
parts and thoughtsTokenCount). A stream is server-sent events, each a GenerateContentResponse with
the text so far's next piece; the last carries the finish reason and the usage.
`fail=content_policy` blocks the prompt (promptFeedback.blockReason SAFETY, no candidates; streamed,
as the stream's one event); `error_after=N` ends a stream with an error event, RESOURCE_EXHAUSTED
with `overloaded`, else UNAVAILABLE;
`filter_after=N` ends the answer with finishReason SAFETY. Function calls carry a thoughtSignature;
a model named gemini-3* refuses a conversation whose current turn (since the last user text) has
a model step's first call without the signature it was sent with, as Google's does. A function's
`parameters` (Google's OpenAPI subset) refuses JSON Schema's own words (additionalProperties,
$ref ...); `parametersJsonSchema` takes them.
"""

from __future__ import annotations

import asyncio
import base64
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from ..core import count_chat_tokens, count_tokens
from . import directives, structured, tools
from .directives import DirectiveError
from .embeddings import vector
from .wire import EventStream, reply
from .words import spaced, within_limit

if TYPE_CHECKING:
    from .state import Simulator

INVALID_KEY = "invalid"
_STATUS = {
    400: "INVALID_ARGUMENT",
    403: "PERMISSION_DENIED",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}


def _error(status: int, message: str, reason: str | None = None) -> web.Response:
    error: dict[str, Any] = {"code": status, "message": message, "status": _STATUS.get(status, "UNKNOWN")}
    if reason is not None:
        error["details"] = [
            {
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": reason,
                "domain": "googleapis.com",
            }
        ]
    return reply(status, orjson.dumps({"error": error}))


async def generate(sim: Simulator, request: web.Request) -> web.StreamResponse:
    return _key_refusal(request) or await answer(sim, request, stream=False)


async def stream_generate(sim: Simulator, request: web.Request) -> web.StreamResponse:
    return _key_refusal(request) or await answer(sim, request, stream=True)


async def batch_embed(sim: Simulator, request: web.Request) -> web.StreamResponse:
    """batchEmbedContents: a deterministic unit vector per text (sim/embeddings.py's), no usage."""
    refused = _key_refusal(request)
    if refused is not None:
        return refused
    try:
        req = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        req = None
    requests = req.get("requests") if isinstance(req, dict) else None
    if not isinstance(requests, list) or not requests:
        return _error(400, "* BatchEmbedContentsRequest.requests: requests is not specified")
    sim.record({"path": request.path, "model": request.match_info["model"], "body": req})
    out = []
    for item in requests:
        text = _text(((item or {}).get("content") or {}).get("parts", [])) if isinstance(item, dict) else ""
        if not text:
            return _error(400, "* BatchEmbedContentsRequest.requests[].content: content is not specified")
        size = item.get("outputDimensionality")
        out.append({"values": vector(text.encode(), size if isinstance(size, int) and size > 0 else 768)})
    return reply(200, orjson.dumps({"embeddings": out}))


def _key_refusal(request: web.Request) -> web.Response | None:
    """Google's answer to a request without a valid API key, else None."""
    key = request.headers.get("x-goog-api-key") or request.query.get("key")
    if not key:
        return _error(
            403, "Method doesn't allow unregistered callers (callers without established identity)."
        )
    if key == INVALID_KEY:
        return _error(400, "API key not valid. Please pass a valid API key.", "API_KEY_INVALID")
    return None


# What a thought signature of the simulator's starts with (Google's are opaque bytes, base64).
SIGNATURE_PREFIX = b"sim-thought:"
# JSON Schema words that `parameters` (Google's OpenAPI subset) does not take: Google answers 400
# naming the first; `parametersJsonSchema` takes them.
_NOT_OPENAPI = ("additionalProperties", "$schema", "$ref", "$defs", "const")


def _function_call(call: tools.ToolCall) -> dict[str, Any]:
    """A functionCall part, with its thought signature, as thinking models send it."""
    signature = base64.b64encode(SIGNATURE_PREFIX + call.name.encode()).decode()
    return {"functionCall": {"name": call.name, "args": call.arguments}, "thoughtSignature": signature}


def _tools_refusal(declared: Any) -> str | None:
    """Google's refusal of a function's parameters it cannot read, else None."""
    for tool in declared if isinstance(declared, list) else []:
        for function in (tool.get("functionDeclarations") or []) if isinstance(tool, dict) else []:
            if not isinstance(function, dict):
                continue
            if "parameters" in function and "parametersJsonSchema" in function:
                return "`parameters` and `parametersJsonSchema` are mutually exclusive."
            unknown = _unknown_name(function.get("parameters"))
            if unknown is not None:
                return (
                    f'Invalid JSON payload received. Unknown name "{unknown}" at '
                    "'tools[0].function_declarations[0].parameters': Cannot find field."
                )
    return None


def _unknown_name(schema: Any) -> str | None:
    if isinstance(schema, dict):
        for name, value in schema.items():
            if name in _NOT_OPENAPI:
                return str(name)
            found = _unknown_name(value)
            if found is not None:
                return found
    elif isinstance(schema, list):
        for value in schema:
            found = _unknown_name(value)
            if found is not None:
                return found
    return None


def _signature_refusal(model: str, contents: list[dict[str, Any]]) -> str | None:
    """Gemini 3's check of the current turn (since the last user text): each model step's first
    function call carries the thought signature it was sent with. Earlier models check nothing."""
    if not model.startswith("gemini-3"):
        return None
    start = max(
        (i for i, c in enumerate(contents) if c.get("role", "user") == "user" and _text(c.get("parts", []))),
        default=0,
    )
    for content in contents[start:]:
        parts = content.get("parts") if content.get("role") == "model" else None
        calls = [p for p in parts or [] if isinstance(p, dict) and "functionCall" in p]
        if not calls:
            continue
        signature = calls[0].get("thoughtSignature")
        if signature is None:
            return "Function call is missing a thought_signature in functionCall parts."
        try:
            valid = base64.b64decode(signature, validate=True).startswith(SIGNATURE_PREFIX)
        except (TypeError, ValueError):
            valid = False
        if not valid:
            return "Corrupted thought signature."
    return None


def _text(parts: Any) -> str:
    return " ".join(p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))


async def answer(sim: Simulator, request: web.Request, *, stream: bool) -> web.StreamResponse:
    """The answer to a signed-in request (an API key here, a Google token on Vertex AI)."""
    body = await request.read()
    try:
        req = orjson.loads(body)
    except orjson.JSONDecodeError:
        req = None
    contents = req.get("contents") if isinstance(req, dict) else None
    if not isinstance(contents, list) or not contents or not all(isinstance(c, dict) for c in contents):
        return _error(400, "* GenerateContentRequest.contents: contents is not specified")
    if any(c.get("role", "user") not in ("user", "model") for c in contents):
        return _error(400, "Please use a valid role: user, model.")
    model = request.match_info["model"]
    sim.record({"path": request.path, "model": model, "body": req})
    refusal = _tools_refusal(req.get("tools")) or _signature_refusal(model, contents)
    if refusal is not None:
        return _error(400, refusal)
    try:
        base, d = directives.parse(model, request.headers.get("x-sim"), _text(contents[-1].get("parts", [])))
    except DirectiveError as exc:
        return _error(400, str(exc))
    if d.ttft:
        await asyncio.sleep(d.ttft)
    if d.fail is not None:
        return _error(d.fail, f"Simulated failure {d.fail}.")
    system = _text((req.get("systemInstruction") or {}).get("parts", []))
    said = [{"role": c.get("role", "user"), "content": _text(c.get("parts", []))} for c in contents]
    prompt_tokens = count_chat_tokens(
        orjson.dumps({"messages": ([{"role": "system", "content": system}] if system else []) + said})
    )
    if d.refuse:
        answer = {
            "promptFeedback": {"blockReason": "SAFETY"},
            "usageMetadata": {"promptTokenCount": prompt_tokens, "totalTokenCount": prompt_tokens},
            "modelVersion": base,
        }
        if stream:  # Google's stream is one event with the feedback, over HTTP 200
            blocked = EventStream(request)
            await blocked.open()
            await blocked.send(b"data: " + orjson.dumps(answer) + b"\r\n\r\n")
            return await blocked.end()
        return reply(200, orjson.dumps(answer))
    config = req.get("generationConfig") or {}
    limit = config.get("maxOutputTokens")
    thought, n = within_limit(limit, d.reasoning, d.tokens)
    words = spaced(body, n)
    schema = structured.requested_schema(req, "gemini")
    if schema is not None:
        words = structured.pieces(structured.answer_text(schema, words))
    thoughts = spaced(body, thought, offset=3)
    finish = "MAX_TOKENS" if n < d.tokens else "STOP"
    if d.filter_after is not None and d.filter_after < len(words):
        words, finish = words[: d.filter_after], "SAFETY"
    declared = [
        {"name": f["name"], "input_schema": f.get("parametersJsonSchema", f.get("parameters"))}
        for t in req.get("tools") or []
        if isinstance(t, dict)
        for f in t.get("functionDeclarations") or []
        if isinstance(f, dict) and isinstance(f.get("name"), str)
    ]
    calling = (req.get("toolConfig") or {}).get("functionCallingConfig") or {}
    allowed = calling.get("allowedFunctionNames")
    choice = (
        {"type": "none"}
        if calling.get("mode") == "NONE"
        else {"type": "tool", "name": allowed[0]}
        if isinstance(allowed, list) and allowed
        else {"type": "any"}
        if calling.get("mode") == "ANY"
        else None
    )
    call = tools.anthropic_tool_call({"tools": declared, "tool_choice": choice}, d.tool, body)
    output_tokens = count_tokens("".join(words) if call is None else call.arguments_json)
    thought_tokens = count_tokens("".join(thoughts)) if thoughts else 0
    usage = {
        "promptTokenCount": prompt_tokens,
        "candidatesTokenCount": output_tokens,
        "totalTokenCount": prompt_tokens + output_tokens + thought_tokens,
        **({"thoughtsTokenCount": thought_tokens} if thought_tokens else {}),
    }
    if not stream:
        parts: list[dict[str, Any]] = (
            [{"text": "".join(thoughts).strip(), "thought": True}] if thoughts else []
        )
        parts.append({"text": "".join(words).strip()} if call is None else _function_call(call))
        answer = {
            "candidates": [
                {"content": {"role": "model", "parts": parts}, "finishReason": finish, "index": 0}
            ],
            "usageMetadata": usage,
            "modelVersion": base,
            "responseId": "sim" + request.path[-6:],
        }
        return reply(200, orjson.dumps(answer))

    out = EventStream(request)
    await out.open()

    async def event(parts: list[dict[str, Any]], last: bool = False) -> None:
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
        answer: dict[str, Any] = {"candidates": [candidate], "modelVersion": base}
        if last:
            candidate["finishReason"] = finish
            answer["usageMetadata"] = usage
        else:
            answer["usageMetadata"] = {"promptTokenCount": prompt_tokens}
        await out.send(b"data: " + orjson.dumps(answer) + b"\r\n\r\n")

    async def fail() -> None:
        error = (
            {
                "code": 429,
                "message": "Resource has been exhausted (e.g. check quota).",
                "status": "RESOURCE_EXHAUSTED",
            }
            if d.overloaded
            else {"code": 503, "message": "Simulated failure mid-stream.", "status": "UNAVAILABLE"}
        )
        await out.send(b"data: " + orjson.dumps({"error": error}) + b"\r\n\r\n")

    pieces: list[dict[str, Any]] = [{"text": t, "thought": True} for t in thoughts]
    pieces += [{"text": w} for w in words] if call is None else [_function_call(call)]
    for i, part in enumerate(pieces):
        if not await directives.before_piece(d, i, out.drop, fail):
            return await out.end()
        await event([part], last=i == len(pieces) - 1)
    if not pieces:
        await event([], last=True)
    return await out.end()

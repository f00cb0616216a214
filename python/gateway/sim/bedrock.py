"""AWS Bedrock's Converse and ConverseStream APIs, with SigV4 checked.

  POST /model/{modelId}/converse          POST /model/{modelId}/converse-stream

A request must be signed (AWS Signature Version 4, service "bedrock") with the simulator's own
key pair, ACCESS_KEY_ID / SECRET_ACCESS_KEY (a session token, when sent, is signed too): the
signature is computed again here, and a missing, unknown, stale or wrong one is refused 403 as
Bedrock refuses it. Bodies are Converse's (messages of content blocks that alternate between user
and assistant, system, inferenceConfig, toolConfig); answers carry its usage and stop reasons;
streams are AWS's binary event stream (messageStart, contentBlockStart/Delta/Stop, messageStop,
metadata), framed here from the format's description, independently of the gateway's parser.
Errors are Bedrock's: `{"message": ...}` with x-amzn-ErrorType, and inside a stream an exception
message (`error_after=N`: modelStreamErrorException). `filter_after=N` ends the answer with the
stop reason content_filtered.
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import re
import struct
import zlib
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from ..core import count_chat_tokens, count_tokens
from ..providers.sigv4 import AwsCredentials, sign
from . import directives, structured, tools
from .directives import DirectiveError
from .wire import EventStream, reply
from .words import spaced

if TYPE_CHECKING:
    from .state import Simulator

ACCESS_KEY_ID = "AKIDSIMULATOR"
SECRET_ACCESS_KEY = "simulator-secret-access-key"
MAX_SKEW = datetime.timedelta(minutes=15)
EVENT_STREAM = "application/vnd.amazon.eventstream"
_CREDENTIAL = re.compile(
    r"^AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/([^/]+)/aws4_request, "
    r"SignedHeaders=([a-z0-9;-]+), Signature=([0-9a-f]{64})$"
)


async def converse(sim: Simulator, request: web.Request) -> web.StreamResponse:
    return await _converse(sim, request, stream=False)


async def converse_stream(sim: Simulator, request: web.Request) -> web.StreamResponse:
    return await _converse(sim, request, stream=True)


def _error(status: int, kind: str, message: str) -> web.Response:
    response = reply(status, orjson.dumps({"message": message}))
    response.headers["x-amzn-ErrorType"] = f"{kind}:http://internal.amazon.com/coral/com.amazon.bedrock/"
    return response


def _refusal(request: web.Request, body: bytes) -> web.Response | None:
    """Bedrock's 403 for a request without a valid signature, else None."""
    match = _CREDENTIAL.match(request.headers.get("authorization", ""))
    if match is None:
        return _error(403, "AccessDeniedException", "Missing Authentication Token")
    key_id, _, region, service, signed, _ = match.groups()
    if key_id != ACCESS_KEY_ID:
        return _error(
            403, "UnrecognizedClientException", "The security token included in the request is invalid."
        )
    try:
        when = datetime.datetime.strptime(request.headers.get("x-amz-date", ""), "%Y%m%dT%H%M%SZ")
    except ValueError:
        return _error(403, "InvalidSignatureException", "The request has no valid X-Amz-Date.")
    when = when.replace(tzinfo=datetime.UTC)
    if abs(datetime.datetime.now(datetime.UTC) - when) > MAX_SKEW:
        return _error(403, "InvalidSignatureException", "Signature expired.")
    headers = {
        name: request.headers.get(name, "")
        for name in signed.split(";")
        if name not in ("host", "x-amz-date", "x-amz-security-token")
    }
    token = request.headers.get("x-amz-security-token")
    creds = AwsCredentials(key_id, SECRET_ACCESS_KEY, token)
    url = f"http://{request.host}{request.raw_path}"
    expected = sign(request.method, url, headers, body, creds, region, service, when)
    if expected["authorization"] != request.headers["authorization"]:
        return _error(
            403,
            "InvalidSignatureException",
            "The request signature we calculated does not match the signature you provided.",
        )
    return None


def _texts(content: Any) -> str:
    return " ".join(b["text"] for b in content if isinstance(b, dict) and isinstance(b.get("text"), str))


def _invalid(req: Any) -> str | None:
    """Why a Converse body is refused (ValidationException), or None."""
    if not isinstance(req, dict):
        return "Malformed input request, please reformat your input and try again."
    messages = req.get("messages")
    if not isinstance(messages, list) or not messages:
        return "The model returned the following errors: messages: at least one message is required"
    roles = [m.get("role") if isinstance(m, dict) else None for m in messages]
    if roles[0] != "user" or any(r not in ("user", "assistant") for r in roles):
        return "A conversation must start with a user message. Try again with a conversation that starts with a user message."  # noqa: E501
    if any(a == b for a, b in itertools.pairwise(roles)):
        return (
            "A conversation must alternate between user and assistant roles. Make sure the conversation "
            "alternates between user and assistant roles and try again."
        )
    if any(not isinstance(m.get("content"), list) or not m["content"] for m in messages):
        return (
            "The content field in the Message object is empty. Add a ContentBlock object to the content "
            "field and try again."
        )
    tool_blocks = any(
        isinstance(b, dict) and ("toolUse" in b or "toolResult" in b) for m in messages for b in m["content"]
    )
    blank = any(
        isinstance(c, dict) and isinstance(c.get("text"), str) and not c["text"].strip()
        for m in messages
        for b in m["content"]
        if isinstance(b, dict)
        for c in ([b] + ((b.get("toolResult") or {}).get("content") or []))
        if isinstance(c, dict)
    )
    if blank:
        return (
            "The text field in the ContentBlock object is blank. Add text to the text field, and try again."
        )
    if tool_blocks and not (req.get("toolConfig") or {}).get("tools"):
        return "The toolConfig field must be defined when using toolUse and toolResult content blocks."
    return _documents_refused(messages)


def _documents_refused(messages: list[Any]) -> str | None:
    """Converse's rules for document blocks: a name once in a request, at most 200 characters, and a
    text block beside them in their message."""
    names: list[str] = []
    for m in messages:
        documents = [
            b["document"] for b in m["content"] if isinstance(b, dict) and isinstance(b.get("document"), dict)
        ]
        if documents and not any(isinstance(b, dict) and "text" in b for b in m["content"]):
            return "A message with documents must include a text block beside them."
        names += [str(d.get("name", "")) for d in documents]
    if len(names) != len(set(names)):
        return "Messages can't contain duplicate document names."
    if any(not name or len(name) > 200 for name in names):
        return "The document name must be from 1 to 200 characters."
    return None


async def _converse(sim: Simulator, request: web.Request, *, stream: bool) -> web.StreamResponse:
    body = await request.read()
    refused = _refusal(request, body)
    if refused is not None:
        return refused
    try:
        req = orjson.loads(body)
    except orjson.JSONDecodeError:
        req = None
    why = _invalid(req)
    if why is not None:
        return _error(400, "ValidationException", why)
    model_id = request.match_info["model"]
    sim.record({"path": request.path, "model": model_id, "body": req})
    try:
        _, d = directives.parse(
            model_id, request.headers.get("x-sim"), _texts(req["messages"][-1]["content"])
        )
    except DirectiveError as exc:
        return _error(400, "ValidationException", str(exc))
    if d.ttft:
        await asyncio.sleep(d.ttft)
    if d.fail == 429:
        return _error(429, "ThrottlingException", "Too many requests, please wait before trying again.")
    if d.fail is not None:
        return _error(d.fail, "ServiceUnavailableException", f"Simulated failure {d.fail}.")
    limit = (req.get("inferenceConfig") or {}).get("maxTokens")
    n = min(d.tokens, limit) if isinstance(limit, int) and limit > 0 else d.tokens
    words = spaced(body, n)
    schema = structured.requested_schema(req, "bedrock")
    if schema is not None:
        words = structured.pieces(structured.answer_text(schema, words))
    stop = "max_tokens" if n < d.tokens else "end_turn"
    if d.filter_after is not None and d.filter_after < len(words):
        words, stop = words[: d.filter_after], "content_filtered"
    config = req.get("toolConfig") or {}
    choice = config.get("toolChoice") or {}
    call = tools.anthropic_tool_call(
        {
            "tools": [
                {
                    "name": t["toolSpec"]["name"],
                    "input_schema": t["toolSpec"].get("inputSchema", {}).get("json"),
                }
                for t in config.get("tools", [])
                if isinstance(t, dict) and isinstance(t.get("toolSpec"), dict)
            ],
            "tool_choice": {"type": "any"}
            if "any" in choice
            else {"type": "tool", **choice["tool"]}
            if "tool" in choice
            else None,
        },
        d.tool,
        body,
    )
    if call is not None:
        stop = "tool_use"
    system = _texts(req.get("system") or [])
    said = [{"role": m["role"], "content": _texts(m["content"])} for m in req["messages"]]
    prompt = ([{"role": "system", "content": system}] if system else []) + said
    input_tokens = count_chat_tokens(orjson.dumps({"messages": prompt}))
    output_tokens = count_tokens("".join(words) if call is None else call.arguments_json)
    usage = {
        "inputTokens": input_tokens,
        "outputTokens": output_tokens,
        "totalTokens": input_tokens + output_tokens,
    }
    if not stream:
        content: list[dict[str, Any]] = (
            [{"text": "".join(words).strip()}]
            if call is None
            else [{"toolUse": {"toolUseId": call.id, "name": call.name, "input": call.arguments}}]
        )
        answer = {
            "output": {"message": {"role": "assistant", "content": content}},
            "stopReason": stop,
            "usage": usage,
            "metrics": {"latencyMs": 1},
        }
        return reply(200, orjson.dumps(answer))

    out = EventStream(request, EVENT_STREAM)
    await out.open()

    async def event(kind: str, data: dict[str, Any]) -> None:
        await out.send(frame(kind, data))

    async def fail() -> None:
        if d.overloaded:
            message = {"message": "Too many requests, please wait before trying again."}
            await out.send(frame_exception("throttlingException", message))
            return
        message = {"message": "Simulated failure mid-stream."}
        await out.send(frame_exception("modelStreamErrorException", message))

    await event("messageStart", {"role": "assistant"})
    if call is not None:
        await event(
            "contentBlockStart",
            {"contentBlockIndex": 0, "start": {"toolUse": {"toolUseId": call.id, "name": call.name}}},
        )
        pieces: list[dict[str, Any]] = [{"toolUse": {"input": p}} for p in call.fragments()]
    else:
        pieces = [{"text": w} for w in words]
    for i, delta in enumerate(pieces):
        if not await directives.before_piece(d, i, out.drop, fail):
            return await out.end()
        await event("contentBlockDelta", {"contentBlockIndex": 0, "delta": delta})
    await event("contentBlockStop", {"contentBlockIndex": 0})
    await event("messageStop", {"stopReason": stop})
    await event("metadata", {"usage": usage, "metrics": {"latencyMs": 1}})
    return await out.end()


def message(headers: list[tuple[str, str]], payload: bytes) -> bytes:
    """One event stream message with string headers, framed from the format's description
    (independently of the gateway's parser, which tests/core/test_eventstream.py checks with it)."""
    head = b""
    for name, value in headers:
        name_bytes, value_bytes = name.encode(), value.encode()
        head += (
            bytes([len(name_bytes)])
            + name_bytes
            + b"\x07"
            + struct.pack(">H", len(value_bytes))
            + value_bytes
        )
    prelude = struct.pack(">II", 16 + len(head) + len(payload), len(head))
    message = prelude + struct.pack(">I", zlib.crc32(prelude)) + head + payload
    return message + struct.pack(">I", zlib.crc32(message))


def frame(kind: str, data: dict[str, Any]) -> bytes:
    """An event of ConverseStream (its payload carries a `p` member of padding, as AWS's does)."""
    padding = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"[: 1 + len(kind) % 20]
    headers = [(":event-type", kind), (":content-type", "application/json"), (":message-type", "event")]
    return message(headers, orjson.dumps({**data, "p": padding}))


def frame_exception(kind: str, data: dict[str, Any]) -> bytes:
    headers = [
        (":exception-type", kind),
        (":content-type", "application/json"),
        (":message-type", "exception"),
    ]
    return message(headers, orjson.dumps(data))

"""Anthropic's Messages API (POST .../v1/messages): its body, its event names, its error format."""

from __future__ import annotations

import asyncio
import hashlib
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from ..core import count_chat_tokens, count_tokens
from . import directives, structured, tools
from .directives import DirectiveError, Directives
from .wire import EventStream, anthropic_error, reply
from .words import last_text, spaced, within_limit

if TYPE_CHECKING:
    from .state import Simulator

# A content block as streamed: its opening, its delta type, the delta's field, and the pieces.
Block = tuple[dict[str, Any], str, str, list[str]]


async def create(sim: Simulator, request: web.Request) -> web.StreamResponse:
    body = await request.read()
    try:
        req = orjson.loads(body)
    except orjson.JSONDecodeError:
        req = None
    return await answer(sim, request, body, req)


async def answer(sim: Simulator, request: web.Request, body: bytes, req: Any) -> web.StreamResponse:
    """The answer to a Messages request already read (Vertex AI's route names the model itself)."""
    if not isinstance(req, dict) or not isinstance(req.get("model"), str):
        return anthropic_error(400, "model: Field required")
    messages = req.get("messages")
    max_tokens = req.get("max_tokens")
    if not isinstance(messages, list) or not messages or not isinstance(max_tokens, int):
        return anthropic_error(400, "messages and max_tokens are required")
    if req.get("tools") is not None and not isinstance(req["tools"], list):
        return anthropic_error(400, "tools: Input should be a valid list")
    refused = _document_refusal(messages) or _thinking_refusal(req)
    if refused is not None:
        return anthropic_error(400, refused)
    headers = request.headers
    sim.record(
        {
            "path": "/v1/messages",
            "body": req,
            "x-api-key": headers.get("x-api-key"),
            "anthropic-version": headers.get("anthropic-version"),
        }
    )
    try:
        model, d = directives.parse(req["model"], headers.get("x-sim"), last_text(messages))
    except DirectiveError as exc:
        return anthropic_error(400, str(exc))
    if d.ttft:
        await asyncio.sleep(d.ttft)
    if d.fail is not None:
        kind = "rate_limit_error" if d.fail == 429 else "overloaded_error" if d.fail == 529 else "api_error"
        return anthropic_error(d.fail, f"Simulated failure {d.fail}.", kind)
    if d.refuse:  # what Anthropic answers when its content filter blocks the output
        return anthropic_error(400, "Output blocked by content filtering policy")
    thinks, n = within_limit(max_tokens, d.reasoning, d.tokens)
    words = spaced(body, n)
    thinking = spaced(body, thinks, offset=3)
    stop = "max_tokens" if n < d.tokens else "end_turn"
    schema = structured.requested_schema(req, "messages")
    if schema is not None:  # JSON for the schema, whole whatever the length
        words, stop = structured.pieces(structured.answer_text(schema, words)), "end_turn"
    call = tools.anthropic_tool_call(req, d.tool, body)
    if call is not None:
        stop = "tool_use"
    system = req.get("system")
    if isinstance(system, list):  # text blocks, counted as the API counts them: their text
        system = "\n".join(
            b["text"] for b in system if isinstance(b, dict) and isinstance(b.get("text"), str)
        )
    prompt = [{"role": "system", "content": system}] if isinstance(system, str) and system else []
    input_tokens = count_chat_tokens(orjson.dumps({"messages": prompt + messages}))
    fresh, read, written, hour = sim.prompt_cache.split(model, req, input_tokens)
    output_tokens = count_tokens("".join(words) if call is None else call.arguments_json) + (
        count_tokens("".join(thinking)) if thinking else 0
    )
    message: dict[str, Any] = {
        "id": "msg_sim" + hashlib.blake2b(body, digest_size=10).hexdigest(),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {
            "input_tokens": fresh,
            "cache_creation_input_tokens": written,
            "cache_read_input_tokens": read,
            "cache_creation": {
                "ephemeral_5m_input_tokens": 0 if hour else written,
                "ephemeral_1h_input_tokens": written if hour else 0,
            },
            "output_tokens": output_tokens,
        },
    }
    if req.get("stream") is not True:
        if thinking:
            text = "".join(thinking)
            message["content"].append({"type": "thinking", "thinking": text, "signature": signature(text)})
        message["content"].append(
            {"type": "text", "text": "".join(words)} if call is None else call.tool_use_block()
        )
        if d.no_usage:
            del message["usage"]
        return reply(200, orjson.dumps(message))
    answer: Block = (
        ({"type": "text", "text": ""}, "text_delta", "text", words)
        if call is None
        else ({**call.tool_use_block(), "input": {}}, "input_json_delta", "partial_json", call.fragments())
    )
    thought: list[Block] = (
        [({"type": "thinking", "thinking": "", "signature": ""}, "thinking_delta", "thinking", thinking)]
        if thinking
        else []
    )
    return await _stream(request, message, [*thought, answer], d)


async def _stream(
    request: web.Request, message: dict[str, Any], blocks: list[Block], d: Directives
) -> web.StreamResponse:
    stream = EventStream(request)
    await stream.open()
    usage = message["usage"]
    started = {**message, "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
    await stream.event("message_start", {"type": "message_start", "message": started})

    async def fail() -> None:
        error = (
            {"type": "overloaded_error", "message": "Overloaded"}
            if d.overloaded
            else {"type": "api_error", "message": "Simulated failure mid-stream."}
        )
        await stream.event("error", {"type": "error", "error": error})

    async def keepalive() -> None:
        await stream.event("ping", {"type": "ping"})

    sent = 0
    for index, (start, delta_type, field, pieces) in enumerate(blocks):
        opening = {"type": "content_block_start", "index": index, "content_block": start}
        await stream.event("content_block_start", opening)
        if index == 0:
            await stream.event("ping", {"type": "ping"})
        for piece in pieces:
            if not await directives.before_piece(d, sent, stream.drop, fail, keepalive):
                return await stream.end()
            delta = {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": delta_type, field: piece},
            }
            await stream.event("content_block_delta", delta)
            sent += 1
        if start["type"] == "thinking":  # the block's signature, last, as Anthropic sends it
            sealed = {"type": "signature_delta", "signature": signature("".join(pieces))}
            await stream.event(
                "content_block_delta", {"type": "content_block_delta", "index": index, "delta": sealed}
            )
        await stream.event("content_block_stop", {"type": "content_block_stop", "index": index})
    await stream.event(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
            # The real API repeats the input and cache counts here (cumulative usage).
            "usage": usage,
        },
    )
    await stream.event("message_stop", {"type": "message_stop"})
    return await stream.end()


def signature(thinking: str) -> str:
    """A thinking block's signature: the simulator's seal on its text, checked when it comes back
    (Anthropic's is opaque; it refuses a block whose text or signature was changed)."""
    return "sim" + hashlib.blake2b(thinking.encode(), digest_size=24).hexdigest()


def _thinking_refusal(req: dict[str, Any]) -> str | None:
    """Anthropic's rule for tool loops with thinking on: the last assistant turn, when it called
    tools, starts with its thinking blocks, given back unchanged."""
    thinking = req.get("thinking")
    if not isinstance(thinking, dict) or thinking.get("type") not in ("enabled", "adaptive"):
        return None
    turns = [
        (i, m) for i, m in enumerate(req["messages"]) if isinstance(m, dict) and m.get("role") == "assistant"
    ]
    if not turns:
        return None
    i, last = turns[-1]
    blocks = (
        [b for b in last.get("content") or [] if isinstance(b, dict)]
        if isinstance(last.get("content"), list)
        else []
    )
    if not any(b.get("type") == "tool_use" for b in blocks):
        return None
    first = blocks[0].get("type")
    if first not in ("thinking", "redacted_thinking"):
        return (
            f"messages.{i}.content.0.type: Expected `thinking` or `redacted_thinking`, but found `{first}`."
            " When `thinking` is enabled, a final `assistant` message must start with a thinking block"
            " (preceeding the lastmost set of `tool_use` and `tool_result` blocks). We recommend you"
            " include thinking blocks from previous turns. To avoid this requirement, disable `thinking`."
        )
    for j, block in enumerate(blocks):
        if block.get("type") == "thinking" and block.get("signature") != signature(
            str(block.get("thinking"))
        ):
            return f"messages.{i}.content.{j}: Invalid `signature` in `thinking` block"
    return None


# What a document's source must say, as Anthropic validates it: base64 data is a PDF, text is plain.
DOCUMENT_SOURCES = {"base64": "application/pdf", "text": "text/plain"}


def _document_refusal(messages: list[Any]) -> str | None:
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        for j, block in enumerate(content if isinstance(content, list) else []):
            if not isinstance(block, dict) or block.get("type") != "document":
                continue
            given = block.get("source")
            source: dict[str, Any] = given if isinstance(given, dict) else {}
            kind = source.get("type")
            at = f"messages.{i}.content.{j}.document.source"
            if kind not in (*DOCUMENT_SOURCES, "url", "content", "file"):
                return f"{at}: Input tag {kind!r} found using 'type' does not match any of the expected tags"
            wanted = DOCUMENT_SOURCES.get(kind)
            if wanted is not None and (
                source.get("media_type") != wanted or not isinstance(source.get("data"), str)
            ):
                return f"{at}.{kind}.media_type: Input should be '{wanted}'"
    return None

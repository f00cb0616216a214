"""The simulator's OpenAI Responses API: plain and streamed, stateful like the real one.

A stored response (store is not false) can be continued with `previous_response_id`; an id this
simulator does not hold is refused as OpenAI refuses it, which is how tests prove that the gateway
sent the next turn to the upstream holding the state. The previous turns count as input tokens, as
they do upstream. Hosted tools are echoed back in `tools`, and web search leaves a web_search_call
item in the output, as the real API does; reasoning models (directive `reasoning=N`) emit a
reasoning item with a summary.

`background: true` (not streamed) answers at once with the response `queued`, as OpenAI does; its
state is then a function of the time since creation, like a video job's (sim/videos.py): queued for
the first fifth of `render=D` (default 2s), then in_progress, then the finished response with its
output and usage, or failed under `render_fail`. GET /responses/{id} reads it, or a stored
response as it finished; POST
/responses/{id}/cancel stops it (cancelled, with the usage of the output produced so far; one
already ended is answered as it is). DELETE /responses/{id} forgets a stored or background response,
as OpenAI's deletes one (404 for an id it does not hold).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from ..core import count_chat_tokens, count_tokens
from . import directives, structured
from .directives import DirectiveError, Directives
from .tools import ToolCall, responses_tool_call
from .wire import EventStream, openai_error, reply
from .words import pick, within_limit

if TYPE_CHECKING:
    from .state import Simulator

WEB_SEARCH_TOOLS = ("web_search", "web_search_preview", "web_search_2025_08_26")
QUEUED_SHARE = 0.2  # the share of a background response's time it spends queued
RUNNING = ("queued", "in_progress")


@dataclass(slots=True)
class Background:
    """A background response: what it will be once finished, and when."""

    finished: dict[str, Any]  # the whole response, output and usage included
    started: float  # time.monotonic() at creation
    render: float
    render_fail: bool
    cancelled: dict[str, Any] | None = None  # the response as it stopped, once cancelled

    def now(self) -> dict[str, Any]:
        """The response as GET /responses/{id} shows it now."""
        if self.cancelled is not None:
            return self.cancelled
        elapsed = time.monotonic() - self.started
        if elapsed >= self.render:
            if not self.render_fail:
                return self.finished
            error = {"code": "server_error", "message": "Simulated failure: the response did not finish."}
            return {**self.finished, "status": "failed", "output": [], "usage": None, "error": error}
        status = "queued" if elapsed < self.render * QUEUED_SHARE else "in_progress"
        return {**self.finished, "status": status, "output": [], "usage": None, "incomplete_details": None}

    def cancel(self) -> dict[str, Any]:
        """Stop it: charged the input and the share of the output produced so far (nothing while
        it was queued). One already ended stays as it was."""
        current = self.now()
        if current["status"] not in RUNNING:
            return current
        usage = None
        full_usage = self.finished["usage"]
        if current["status"] == "in_progress":
            done = min(1.0, (time.monotonic() - self.started) / self.render)
            output = int(full_usage["output_tokens"] * done)
            usage = {
                **full_usage,
                "output_tokens": output,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": full_usage["input_tokens"] + output,
            }
        self.cancelled = {**current, "status": "cancelled", "usage": usage}
        return self.cancelled


class ResponseStore:
    """Stored conversations (for previous_response_id) and background responses."""

    def __init__(self, history: int = 10_000) -> None:
        # upstream response id -> the conversation up to and including that response, as messages
        self.stored: dict[str, list[dict[str, Any]]] = {}
        # upstream response id -> the stored response as GET /responses/{id} shows it
        self.answers: dict[str, dict[str, Any]] = {}
        self.background: dict[str, Background] = {}
        self.history = history

    def keep(self, response: dict[str, Any]) -> None:
        """A stored response, finished, for GET /responses/{id}."""
        if len(self.answers) >= self.history:
            self.answers.pop(next(iter(self.answers)))
        self.answers[response["id"]] = response


async def create(sim: Simulator, request: web.Request) -> web.StreamResponse:
    """POST .../responses."""
    body = await request.read()
    store = sim.responses
    try:
        req = orjson.loads(body)
    except orjson.JSONDecodeError:
        req = None
    if not isinstance(req, dict) or not isinstance(req.get("model"), str):
        return openai_error(400, "'model' is required.", param="model")
    sim.record({"path": "/v1/responses", "body": req})
    turn = _messages(req.get("input"))
    if turn is None:
        return openai_error(400, "'input' must be a string or an array.")
    previous_id = req.get("previous_response_id")
    history: list[dict[str, Any]] = []
    if previous_id is not None:
        if not isinstance(previous_id, str) or previous_id not in store.stored:
            return openai_error(
                400,
                f"Previous response with id '{previous_id}' not found.",
                code="previous_response_not_found",
                param="previous_response_id",
            )
        history = store.stored[previous_id]
    try:
        model, d = directives.parse(req["model"], request.headers.get("x-sim"), _last_text(turn))
    except DirectiveError as exc:
        return openai_error(400, str(exc))
    if d.ttft:
        await asyncio.sleep(d.ttft)
    if d.fail is not None:
        return openai_error(d.fail, f"Simulated failure {d.fail}.", "server_error")

    limit = req.get("max_output_tokens")
    thought, n = within_limit(limit, d.reasoning, d.tokens)
    words = _words(body, n)
    reasoning = _words(body, thought, offset=3)
    schema = structured.requested_schema(req, "responses")
    if schema is not None:  # JSON for the schema, whole whatever the length
        words, n = structured.pieces(structured.answer_text(schema, words)), d.tokens
    instructions = req.get("instructions")
    prompt = ([{"role": "system", "content": instructions}] if isinstance(instructions, str) else []) + [
        *history,
        *turn,
    ]
    reasoning_tokens = count_tokens("".join(reasoning)) if reasoning else 0
    usage: dict[str, Any] = {
        "input_tokens": count_chat_tokens(orjson.dumps({"messages": prompt})),
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": count_tokens("".join(words)) + reasoning_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
    }
    usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
    rid = "resp_" + os.urandom(24).hex()
    if req.get("store") is not False:
        if len(store.stored) >= store.history:
            store.stored.pop(next(iter(store.stored)))
        store.stored[rid] = [*history, *turn, {"role": "assistant", "content": "".join(words).strip()}]
    response = _response(req, rid, model, previous_id, incomplete=n < d.tokens)
    search = _web_search(req.get("tools"), _last_text(turn))
    call = responses_tool_call(req, d.tool, body)
    if call is not None:  # a turn that calls a function says nothing else
        words = []
        usage["output_tokens"] = count_tokens(call.arguments_json) + reasoning_tokens
        usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
    if req.get("stream") is not True:
        text = "".join(words).strip()
        response["output"] = [
            *([search] if search else []),
            *([_reasoning_item(rid, "".join(reasoning).strip())] if reasoning else []),
            _function_call_item(call) if call else _message_item(rid, text, response["status"]),
        ]
        response["usage"] = usage
        if req.get("background") is True:
            response["background"] = True
            job = Background(response, time.monotonic(), d.render, d.render_fail)
            if len(store.background) >= store.history:
                store.background.pop(next(iter(store.background)))
            store.background[rid] = job
            response = job.now()
        elif req.get("store") is not False:
            store.keep(response)
        return reply(200, orjson.dumps(response))
    kept = store if req.get("store") is not False else None
    return await _stream(request, response, usage, search, call, words, reasoning, d, kept)


async def retrieve(sim: Simulator, request: web.Request) -> web.StreamResponse:
    """GET .../responses/{id}: a stored response, or a background one as it is now."""
    kept = sim.responses.answers.get(request.match_info["id"])
    if kept is not None:
        sim.record({"path": request.path, "method": "GET", "body": {}})
        return reply(200, orjson.dumps(kept))
    return _job(sim, request, cancel=False)


async def cancel(sim: Simulator, request: web.Request) -> web.StreamResponse:
    """POST .../responses/{id}/cancel."""
    return _job(sim, request, cancel=True)


async def delete(sim: Simulator, request: web.Request) -> web.StreamResponse:
    """DELETE .../responses/{id}: a continuation naming it is refused from then on."""
    rid = request.match_info["id"]
    sim.record({"path": request.path, "method": "DELETE", "body": {}})
    sim.responses.answers.pop(rid, None)
    held = sim.responses.stored.pop(rid, None), sim.responses.background.pop(rid, None)
    if held == (None, None):
        return openai_error(404, f"Response with id '{rid}' not found.", code="not_found")
    return reply(200, orjson.dumps({"id": rid, "object": "response", "deleted": True}))


def _job(sim: Simulator, request: web.Request, *, cancel: bool) -> web.StreamResponse:
    rid = request.match_info["id"]
    sim.record({"path": request.path, "method": request.method, "body": {}})
    job = sim.responses.background.get(rid)
    if job is None:
        return openai_error(404, f"Response with id '{rid}' not found.", code="not_found")
    return reply(200, orjson.dumps(job.cancel() if cancel else job.now()))


async def _stream(
    request: web.Request,
    response: dict[str, Any],
    usage: dict[str, Any],
    search: dict[str, Any] | None,
    call: ToolCall | None,
    words: list[str],
    reasoning: list[str],
    d: Directives,
    kept: ResponseStore | None,
) -> web.StreamResponse:
    stream = EventStream(request)
    await stream.open()
    sequence = 0

    async def event(kind: str, **fields: Any) -> None:
        nonlocal sequence
        await stream.event(kind, {"type": kind, "sequence_number": sequence, **fields})
        sequence += 1

    final = response["status"]
    started = {**response, "status": "in_progress"}
    await event("response.created", response=started)
    await event("response.in_progress", response=started)
    output: list[dict[str, Any]] = []
    if search:
        index = len(output)
        await event(
            "response.output_item.added", output_index=index, item={**search, "status": "in_progress"}
        )
        await event("response.web_search_call.in_progress", output_index=index, item_id=search["id"])
        await event("response.web_search_call.searching", output_index=index, item_id=search["id"])
        await event("response.web_search_call.completed", output_index=index, item_id=search["id"])
        await event("response.output_item.done", output_index=index, item=search)
        output.append(search)

    sent = 0

    async def fail() -> None:
        if d.overloaded:
            await event("error", code="rate_limit_exceeded", message="Rate limit reached.", param=None)
            return
        await event("error", code="server_error", message="Simulated failure mid-stream.", param=None)

    async def pace() -> bool:
        """Before each streamed piece: the directives that slow or break the stream. False: stop."""
        nonlocal sent
        if not await directives.before_piece(d, sent, stream.drop, fail):
            return False
        sent += 1
        return True

    if reasoning:
        item = _reasoning_item(response["id"], "")
        index = len(output)
        await event("response.output_item.added", output_index=index, item={**item, "summary": []})
        part = {"type": "summary_text", "text": ""}
        await event(
            "response.reasoning_summary_part.added",
            item_id=item["id"],
            output_index=index,
            summary_index=0,
            part=part,
        )
        for word in reasoning:
            if not await pace():
                return await stream.end()
            await event(
                "response.reasoning_summary_text.delta",
                item_id=item["id"],
                output_index=index,
                summary_index=0,
                delta=word,
            )
        text = "".join(reasoning)
        done = {"type": "summary_text", "text": text}
        await event(
            "response.reasoning_summary_text.done",
            item_id=item["id"],
            output_index=index,
            summary_index=0,
            text=text,
        )
        await event(
            "response.reasoning_summary_part.done",
            item_id=item["id"],
            output_index=index,
            summary_index=0,
            part=done,
        )
        item = {**item, "summary": [done]}
        await event("response.output_item.done", output_index=index, item=item)
        output.append(item)

    if call is not None:
        item = _function_call_item(call)
        index = len(output)
        await event(
            "response.output_item.added",
            output_index=index,
            item={**item, "arguments": "", "status": "in_progress"},
        )
        for piece in call.fragments():
            if not await pace():
                return await stream.end()
            await event(
                "response.function_call_arguments.delta", item_id=item["id"], output_index=index, delta=piece
            )
        await event(
            "response.function_call_arguments.done",
            item_id=item["id"],
            output_index=index,
            arguments=call.arguments_json,
        )
        await event("response.output_item.done", output_index=index, item=item)
        output.append(item)
        finished = {**response, "output": output, "usage": usage}
        if kept is not None:
            kept.keep(finished)
        await event("response.completed", response=finished)
        return await stream.end()

    message = _message_item(response["id"], "", "in_progress")
    index = len(output)
    await event("response.output_item.added", output_index=index, item={**message, "content": []})
    where: dict[str, Any] = {"item_id": message["id"], "output_index": index, "content_index": 0}
    await event(
        "response.content_part.added", **where, part={"type": "output_text", "text": "", "annotations": []}
    )
    for word in words:
        if not await pace():
            return await stream.end()
        await event("response.output_text.delta", **where, delta=word, logprobs=[])
    text = "".join(words)
    await event("response.output_text.done", **where, text=text, logprobs=[])
    text_part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    await event("response.content_part.done", **where, part=text_part)
    status = "completed" if final == "completed" else "incomplete"
    message = {**message, "status": status, "content": [text_part]}
    await event("response.output_item.done", output_index=index, item=message)
    output.append(message)
    finished = {**response, "output": output, "usage": usage}
    if kept is not None:
        kept.keep(finished)
    await event("response.completed" if final == "completed" else "response.incomplete", response=finished)
    return await stream.end()


def _messages(value: Any) -> list[dict[str, Any]] | None:
    """The request's input as chat messages (for counting and for the stored conversation)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        return None
    out = []
    for item in value:
        if not isinstance(item, dict):
            return None
        content = item.get("content")
        if isinstance(content, list):
            content = " ".join(
                p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
            )
        elif item.get("type") == "function_call_output":
            content = item.get("output")
        out.append(
            {"role": str(item.get("role", "user")), "content": content if isinstance(content, str) else ""}
        )
    return out


def _last_text(messages: list[dict[str, Any]]) -> str | None:
    return messages[-1]["content"] if messages else None


def _words(seed: bytes, count: int, offset: int = 0) -> list[str]:
    """Streamed words: the first without a leading space, as the Responses API's text starts."""
    return [("" if i == 0 else " ") + w for i, w in enumerate(pick(seed, count, offset))]


def _response(
    req: dict[str, Any], rid: str, model: str, previous_id: Any, *, incomplete: bool
) -> dict[str, Any]:
    def given(name: str, default: Any) -> Any:
        return req.get(name, default)

    return {
        "id": rid,
        "object": "response",
        "created_at": int(time.time()),
        "status": "incomplete" if incomplete else "completed",
        "background": False,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": given("instructions", None),
        "max_output_tokens": given("max_output_tokens", None),
        "max_tool_calls": None,
        "model": model,
        "output": [],
        "parallel_tool_calls": given("parallel_tool_calls", True),
        "previous_response_id": previous_id,
        "reasoning": given("reasoning", {"effort": None, "summary": None}),
        "service_tier": "default",
        "store": given("store", True),
        "temperature": given("temperature", 1.0),
        "text": given("text", {"format": {"type": "text"}, "verbosity": "medium"}),
        "tool_choice": given("tool_choice", "auto"),
        "tools": given("tools", []),
        "top_logprobs": 0,
        "top_p": given("top_p", 1.0),
        "truncation": "disabled",
        "usage": None,
        "user": None,
        "metadata": given("metadata", {}),
    }


def _message_item(rid: str, text: str, status: str) -> dict[str, Any]:
    return {
        "id": "msg_" + rid[5:],
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


def _function_call_item(call: ToolCall) -> dict[str, Any]:
    return {
        "id": "fc_" + call.id[5:],
        "type": "function_call",
        "status": "completed",
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments_json,
    }


def _reasoning_item(rid: str, summary: str) -> dict[str, Any]:
    return {
        "id": "rs_" + rid[5:],
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": summary}],
    }


def _web_search(tools: Any, query: str | None) -> dict[str, Any] | None:
    if not isinstance(tools, list) or not any(
        isinstance(t, dict) and t.get("type") in WEB_SEARCH_TOOLS for t in tools
    ):
        return None
    return {
        "id": "ws_" + hashlib.blake2b((query or "").encode(), digest_size=12).hexdigest(),
        "type": "web_search_call",
        "status": "completed",
        "action": {"type": "search", "query": query or ""},
    }

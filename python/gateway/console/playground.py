"""The playground (docs/console.md): chat with the account's models, conversations kept until a
member deletes them (spec 8).

A playground request is a real model request, charged and logged like any other: it runs in
process through the very endpoint that serves POST /v1/chat/completions (rate limits, holds,
billing, request logs), under the account's key named PLAYGROUND_KEY (gateway.auth's CONSOLE_CALL
hands the endpoint that key's context instead of an Authorization header). That key is created the
first time it is needed with a random secret that is thrown away at once: the store keeps only its
hash, so nobody can use it outside the console.

The browser reads the answer as newline-delimited JSON events (`run_events`): `start` (the request
id), `delta` (text as the model streams it), then `done` (tokens, cost, latency) or `error`. Model
output is text: the scripts set it with textContent, the templates escape it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Final
from urllib.parse import quote

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route
from starlette.types import Message

from .. import management
from ..auth import CONSOLE_CALL
from ..clock import now_ms
from ..config import ModelConfig
from ..errors import GatewayError, invalid_request, request_too_large
from ..management import PLAYGROUND_KEY
from ..routes.common import parse_object, read_body
from ..state import GatewayState
from ..store import Account, ApiKey, ChatMessage, Conversation, KeyContext, Store
from ..store.records import new_chat_message, new_id
from .endpoints import Console
from .forms import bounded_body, form_of, replay_body
from .render import page
from .security import Viewer

CHAT_PATH: Final = "/v1/chat/completions"
# The model types /v1/chat/completions serves: its own, and the messages shape it translates.
CHAT_TYPES: Final = ("chat", "messages")
NEW_TITLE: Final = "New conversation"
FAILED: Final = "failed"  # the role of a note saying a turn failed (its error), kept to show
MAX_TITLE_CHARS: Final = 80
MAX_TEXT_CHARS: Final = 200_000
MAX_JSON_BYTES: Final = 1 << 20  # a playground or compare request's JSON body: 1 MiB
# How long the usage record of a finished request may take to become readable (Ledger.get_usage).
USAGE_WAIT_S: Final = 3.0
REQUEST_ID_HEADER: Final = b"x-service-request-id"
NDJSON: Final = "application/x-ndjson"
log = logging.getLogger("gateway.console")

# The message the API answers a request of an expired key with (gateway.auth).
KEY_EXPIRED: Final = "This API key has expired. Create a new key in the console."
# Runs that outlive the browser's connection (the answer is stored even if the page is closed).
_running: set[asyncio.Task[None]] = set()


def chat_models(state: GatewayState, account: Account) -> list[ModelConfig]:
    """The models the account may chat with: what /v1/chat/completions serves and it is allowed."""
    allowed = account.allowed_models
    return [
        m for m in state.settings.models if m.type in CHAT_TYPES and (allowed is None or m.name in allowed)
    ]


def playground_key(keys: list[ApiKey]) -> ApiKey | None:
    """The playground's key among an account's keys: the oldest live (not deleted) one named
    PLAYGROUND_KEY (the first the console made; the console gives no other key that name), by
    creation time, then id: the same one for every request and every process."""
    live = [k for k in keys if k.name == PLAYGROUND_KEY and k.deleted_at_ms is None]
    return min(live, key=lambda k: (k.created_at_ms, k.id), default=None)


class _AccountLocks:
    """One lock per account, held only while its playground key is made (two first requests at
    once would otherwise make two keys; across processes the oldest live one is used). A lock is
    kept only while someone holds or awaits it: the map never grows past the requests in flight."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @asynccontextmanager
    async def hold(self, account_id: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(account_id, (asyncio.Lock(), 0))
        self._locks[account_id] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[account_id]
            if users == 1:
                del self._locks[account_id]
            else:
                self._locks[account_id] = (lock, users - 1)


_making_key = _AccountLocks()


async def playground_context(store: Store, account_id: str) -> KeyContext:
    """The account's playground key (made now if it has none) with the account as it stands. An
    expired one is refused as the API refuses it (401 key_expired): the member's expiry stops the
    playground, and no other key is made or used in its place."""
    key = playground_key(await store.list_keys(account_id))
    if key is None:
        async with _making_key.hold(account_id):
            key = playground_key(await store.list_keys(account_id))
            if key is None:  # its secret is thrown away at once: only its hash is kept
                key, _ = await management.create_key(
                    store, account_id, {"name": PLAYGROUND_KEY}, playground=True
                )
    if key.expires_at_ms is not None and key.expires_at_ms <= now_ms():
        raise GatewayError("key_expired", KEY_EXPIRED)
    return KeyContext(key=key, account=await management.account(store, account_id))


# ---------------------------------------------------------------- one request, in process


@dataclass
class Outcome:
    """How an in-process chat request ended."""

    status: int = 0
    request_id: str | None = None
    response_id: str | None = None
    text: str = ""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost: Decimal | None = None
    error_code: str | None = None
    error_message: str | None = None
    ttft_ms: int | None = None
    total_ms: int = 0
    started: float = field(default_factory=time.monotonic)

    def usage_json(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cost": None if self.cost is None else _money_text(self.cost),
            "ttft_ms": self.ttft_ms,
            "total_ms": self.total_ms,
        }


Emit = Callable[[dict[str, Any]], None]


async def run_chat(
    request: Request, ctx: KeyContext, payload: dict[str, Any], emit: Emit, gone: asyncio.Event
) -> Outcome:
    """POST /v1/chat/completions with `payload` (streamed) in process, under `ctx`: the endpoint's
    own code from authentication to settlement. Calls `emit` with a `start` event once the answer
    begins and a `delta` event for each piece of text; returns how it ended, with the usage record's
    tokens and cost (exactly what was charged). `gone` set: the browser left, and the request is
    ended as a client that disconnects (billed what it delivered)."""
    out = Outcome()
    body = orjson.dumps(payload)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"user-agent", b"gateway-console-playground"),
    ]
    if host := request.headers.get("host"):
        headers.append((b"host", host.encode("latin-1")))
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": request.url.scheme,
        "path": CHAT_PATH,
        "raw_path": CHAT_PATH.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": headers,
        "client": request.scope.get("client"),
        "server": request.scope.get("server"),
        CONSOLE_CALL: ctx,
    }
    if "state" in request.scope:
        scope["state"] = dict(request.scope["state"])

    async def disconnected() -> Message:  # once the browser has gone
        await gone.wait()
        return {"type": "http.disconnect"}

    receive = replay_body(body, disconnected)

    raw = bytearray()  # a plain (error) answer's body
    pending = bytearray()  # SSE bytes not yet split into events
    streamed = False

    def on_event(data: bytes) -> None:
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            return
        if not isinstance(event, dict):
            return
        if isinstance(event.get("error"), dict):
            error = event["error"]
            out.error_code = str(error.get("code") or "provider_error")
            out.error_message = str(error.get("message") or "The model failed.")
            return
        if isinstance(event.get("id"), str):
            out.response_id = event["id"]
        for choice in event.get("choices") or ():
            delta = choice.get("delta") if isinstance(choice, dict) else None
            content = delta.get("content") if isinstance(delta, dict) else None
            if isinstance(content, str) and content:
                if out.ttft_ms is None:
                    out.ttft_ms = _ms_since(out.started)
                out.text += content
                emit({"type": "delta", "text": content})
        usage = event.get("usage")
        if isinstance(usage, dict):
            out.prompt_tokens = _int(usage.get("prompt_tokens"))
            out.completion_tokens = _int(usage.get("completion_tokens"))

    async def send(message: Message) -> None:
        nonlocal streamed
        if message["type"] == "http.response.start":
            out.status = message["status"]
            for name, value in message.get("headers", ()):
                if name.lower() == REQUEST_ID_HEADER:
                    out.request_id = value.decode("latin-1")
                elif name.lower() == b"content-type":
                    streamed = value.startswith(b"text/event-stream")
            if out.status == 200:
                emit({"type": "start", "request_id": out.request_id})
        elif message["type"] == "http.response.body":
            chunk = message.get("body", b"")
            if not streamed:
                raw.extend(chunk)
                return
            pending.extend(chunk.replace(b"\r\n", b"\n"))
            while (end := pending.find(b"\n\n")) >= 0:
                event, pending[: end + 2] = bytes(pending[:end]), b""
                data = b"\n".join(
                    line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:")
                )
                if data and data != b"[DONE]":
                    on_event(data)

    try:
        await request.app(scope, receive, send)
    except Exception:  # the app's own error handler answered (a 500) before re-raising
        if out.status == 0:
            out.status = 500
    out.total_ms = _ms_since(out.started)
    if out.status != 200:
        out.error_code, out.error_message = _error_of(bytes(raw), out.status)
    elif not streamed and out.error_code is None:
        out.error_code, out.error_message = "api_error", "The model's answer was not a stream."
    if out.response_id is not None and (out.text or out.prompt_tokens):
        record = await _usage_record(request, ctx, out.response_id)
        if record is not None:  # what was charged: the figures shown are the ones billed
            out.prompt_tokens, out.completion_tokens, out.cost = (
                record.prompt_tokens,
                record.completion_tokens,
                record.cost,
            )
    return out


async def _usage_record(request: Request, ctx: KeyContext, response_id: str) -> Any:
    state: GatewayState = request.app.state.gateway
    deadline = time.monotonic() + USAGE_WAIT_S
    while True:
        record = await state.store.get_usage(response_id, ctx.key.id)
        if record is not None or time.monotonic() >= deadline:
            return record
        await asyncio.sleep(0.02)


def _error_of(body: bytes, status: int) -> tuple[str, str]:
    try:
        error = orjson.loads(body).get("error")
        return str(error.get("code") or "api_error"), str(error.get("message") or f"HTTP {status}")
    except (orjson.JSONDecodeError, AttributeError):
        return "api_error", f"The request failed with HTTP {status}."


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _ms_since(start: float) -> int:
    return int((time.monotonic() - start) * 1000)


def _money_text(value: Decimal) -> str:
    return "0" if value.is_zero() else format(value.normalize(), "f")


def streamed_events(work: Callable[[Emit, asyncio.Event], Awaitable[None]]) -> StreamingResponse:
    """An NDJSON answer fed by `work(emit, gone)`, which runs to its end even when the browser
    leaves (then `gone` is set, and its model request ends as a client that disconnects)."""
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()
    gone = asyncio.Event()

    def emit(event: dict[str, Any]) -> None:
        queue.put_nowait(orjson.dumps(event) + b"\n")

    async def drive() -> None:
        try:
            await work(emit, gone)
        except GatewayError as err:
            emit({"type": "error", "code": err.code, "message": err.message, "status": err.status})
        except Exception:
            log.exception("a playground request failed unexpectedly")
            message = "The console failed unexpectedly."
            emit({"type": "error", "code": "api_error", "message": message, "status": 500})
        finally:
            queue.put_nowait(None)

    task = asyncio.create_task(drive())
    _running.add(task)
    task.add_done_callback(_running.discard)

    async def body() -> AsyncIterator[bytes]:
        try:
            while (line := await queue.get()) is not None:
                yield line
        finally:
            gone.set()

    return StreamingResponse(body(), media_type=NDJSON, headers={"x-accel-buffering": "no"})


def error_event(out: Outcome) -> dict[str, Any]:
    return {
        "type": "error",
        "code": out.error_code,
        "message": out.error_message,
        "status": out.status,
        **out.usage_json(),
    }


async def read_json(request: Request, limit: int = MAX_JSON_BYTES) -> dict[str, Any]:
    """The request's JSON object: 413 as soon as the body passes `limit` bytes (never buffered
    further), 400 for anything but a JSON object (a too deeply nested one included)."""
    raw = await read_body(request, limit)  # bounded_body has read it (within MAX_JSON_BYTES)
    if len(raw) > limit:
        raise request_too_large(limit, "console's")
    # The model endpoints' reading: a lone surrogate escape, NaN or too deep a nesting is refused
    # here, not by the store or the upstream's encoder (fuzz review: a 500).
    return parse_object(raw or b"{}")


def pick_model(state: GatewayState, account: Account, name: Any) -> ModelConfig:
    if not isinstance(name, str) or not name:
        raise invalid_request("`model` is required: the name of a model to chat with.", "model")
    for model in chat_models(state, account):
        if model.name == name:
            return model
    found = state.registry.get(name)
    if found is None:  # as /v1/chat/completions says of a name that is none
        raise GatewayError("model_not_found", f"The model {name!r} does not exist.", param="model")
    if found.type not in CHAT_TYPES:  # ... and of a model of another type (console review: 403)
        raise invalid_request(
            f"The model {name!r} is not a chat model: the playground chats with chat models.", "model"
        )
    raise GatewayError(
        "model_not_allowed", f"This account may not chat with the model {name!r}.", param="model"
    )


# ---------------------------------------------------------------- conversations as pages show them


def message_json(m: ChatMessage) -> dict[str, Any]:
    return {
        "id": m.id,
        "role": m.role,
        "content": m.content,
        "model": m.model,
        "request_id": m.request_id,
        "prompt_tokens": m.prompt_tokens,
        "completion_tokens": m.completion_tokens,
        "cost": None if m.cost is None else _money_text(m.cost),
    }


def title_from(text: str) -> str:
    line = " ".join(text.split())
    return (line[: MAX_TITLE_CHARS - 1] + "…") if len(line) > MAX_TITLE_CHARS else (line or NEW_TITLE)


def history_messages(messages: list[ChatMessage]) -> list[dict[str, str]]:
    """What a model is sent of a conversation: its system, user and assistant turns, less each user
    turn that failed and was left unanswered (a FAILED note after it, then another turn that is not
    its answer): it would be said again with every later turn, and a refused one would have every
    later turn refused too (review). A turn answered once tried again stays, as does the last."""
    said: list[dict[str, str]] = []
    following: ChatMessage | None = None  # the message after this one
    next_turn: str | None = None  # the role of the next message that is not a note
    for m in reversed(messages):
        noted = following is not None and following.role == FAILED
        left = m.role == "user" and noted and next_turn not in (None, "assistant")
        if m.role in ("system", "user", "assistant") and not left:
            said.append({"role": m.role, "content": m.content})
        if m.role != FAILED:
            next_turn = m.role
        following = m
    return said[::-1]


def unanswered(messages: list[ChatMessage]) -> int | None:
    """Where the user turn waiting for an answer is (the last turn but for the failure notes after
    it, which "Answer the last message" tries again); None when the last turn was answered."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].role != FAILED:
            return i if messages[i].role == "user" else None
    return None


def _text_of(content: Any) -> str | None:
    """A chat or messages request's message content as text (parts joined), or None."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [str(p["text"]) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
        return "\n".join(parts) if parts else None
    return None


def messages_from_log_body(body: bytes) -> tuple[str | None, list[tuple[str, str]]]:
    """The model and (role, text) messages of a logged chat (or messages) request body."""
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError):
        raise invalid_request(
            "This log entry's request body cannot be read as JSON (it may have been cut at the log's"
            " size limit)."
        ) from None
    if not isinstance(payload, dict) or not isinstance(payload.get("messages"), list):
        raise invalid_request("This log entry is not a chat request.")
    found: list[tuple[str, str]] = []
    system = _text_of(payload.get("system"))  # the messages shape keeps it apart
    if system:
        found.append(("system", system))
    for m in payload["messages"]:
        if not isinstance(m, dict):
            continue
        role = m.get("role")
        role = "system" if role == "developer" else role
        text = _text_of(m.get("content"))
        if role in ("system", "user", "assistant") and text:
            found.append((role, text))
    model = payload.get("model")
    return (model if isinstance(model, str) else None), found


# ---------------------------------------------------------------- routes


def routes(console: Console) -> list[BaseRoute]:
    state = console.state
    store = state.store

    def base(account: Account) -> str:
        return f"/console/a/{account.id}/playground"

    async def new_conversation(account: Account, viewer: Viewer, title: str) -> Conversation:
        now = now_ms()
        conversation = Conversation(
            id=new_id("conv_"),
            account_id=account.id,
            user_id=None if viewer.user is None else viewer.user.id,
            title=title,
            created_at_ms=now,
            updated_at_ms=now,
        )
        await store.create_conversation(conversation)
        return conversation

    async def conversation_of(
        account: Account, conversation_id: str
    ) -> tuple[Conversation, list[ChatMessage]]:
        found = await store.get_conversation(conversation_id, account.id)
        if found is None:
            raise GatewayError("not_found", f"No conversation {conversation_id!r}.")
        return found

    async def playground(request: Request, viewer: Viewer) -> Response:
        account = await console.account_of(request, viewer)
        from_log = request.query_params.get("from_log")
        if from_log:  # the old link: a GET changes nothing; the entry's page has the button (a POST)
            entry_url = f"/console/a/{account.id}/logs/{quote(from_log, safe='')}"
            return RedirectResponse(entry_url, status_code=303)
        models = chat_models(state, account)
        conversations = await store.list_conversations(account.id)
        current: Conversation | None = None
        messages: list[ChatMessage] = []
        chosen = request.query_params.get("c")
        if chosen:
            current, messages = await conversation_of(account, chosen)
        used = [m.model for m in messages if m.model]
        names = [m.name for m in models]
        model = used[-1] if used and used[-1] in names else (names[0] if names else None)
        return page(
            request,
            "playground.html",
            viewer,
            account=account,
            models=models,
            model=model,
            conversations=conversations,
            current=current,
            messages=messages,
            waiting=unanswered(messages) is not None,
        )

    async def from_log(request: Request, viewer: Viewer) -> Response:
        """A logged chat request as a new conversation (the log entry's Open in playground)."""
        account = await console.account_of(request, viewer)
        conversation = await open_from_log(account, viewer, request.path_params["log_id"])
        return RedirectResponse(f"{base(account)}?c={conversation.id}", status_code=303)

    async def open_from_log(account: Account, viewer: Viewer, log_id: str) -> Conversation:
        entry = await store.get_request_log(log_id)
        if entry is None or entry.account_id != account.id:
            raise GatewayError("not_found", f"No request log {log_id!r}.")
        if entry.request_body is None:
            raise invalid_request("This log entry's request body is no longer kept.")
        model, found = messages_from_log_body(entry.request_body)
        if not found:
            raise invalid_request("This log entry's request has no text messages to open.")
        model = entry.model or model
        first_user = next((text for role, text in found if role == "user"), "")
        conversation = await new_conversation(account, viewer, title_from(first_user))
        for role, text in found:
            message = new_chat_message(conversation.id, role, text, model)
            await store.add_chat_message(message, account.id)
        return conversation

    async def create(request: Request, viewer: Viewer) -> Response:
        account = await console.account_of(request, viewer)
        payload = await read_json(request)
        title = payload.get("title")
        conversation = await new_conversation(
            account, viewer, title_from(title) if isinstance(title, str) and title.strip() else NEW_TITLE
        )
        return JSONResponse({"id": conversation.id, "title": conversation.title}, status_code=201)

    async def rename(request: Request, viewer: Viewer) -> Response:
        account = await console.account_of(request, viewer)
        conversation_id = request.path_params["conversation_id"]
        form = await form_of(request)
        title = str(form.get("title") or "").strip()
        if not title:
            raise invalid_request("Give the conversation a title.", "title")
        if not await store.rename_conversation(conversation_id, account.id, title[:MAX_TITLE_CHARS]):
            raise GatewayError("not_found", f"No conversation {conversation_id!r}.")
        return RedirectResponse(f"{base(account)}?c={conversation_id}", status_code=303)

    async def delete(request: Request, viewer: Viewer) -> Response:
        account = await console.account_of(request, viewer)
        conversation_id = request.path_params["conversation_id"]
        if not await store.delete_conversation(conversation_id, account.id):
            raise GatewayError("not_found", f"No conversation {conversation_id!r}.")
        return RedirectResponse(base(account), status_code=303)

    async def send_message(request: Request, viewer: Viewer) -> Response:
        account = await console.account_of(request, viewer)
        conversation, messages = await conversation_of(account, request.path_params["conversation_id"])
        payload = await read_json(request)
        text = payload.get("content")
        if text is not None and not isinstance(text, str):
            raise invalid_request("`content` must be text.", "content")
        if text is not None and len(text) > MAX_TEXT_CHARS:
            raise invalid_request(f"A message may have at most {MAX_TEXT_CHARS} characters.", "content")
        model = pick_model(state, account, payload.get("model"))
        typed = text if text is not None and text.strip() else None  # a new message, if any
        waiting = unanswered(messages)
        if typed is None and waiting is None:
            raise invalid_request("Write a message first.", "content")
        ctx = await playground_context(store, account.id)  # before anything is kept: it may refuse
        if typed is not None:
            message = new_chat_message(conversation.id, "user", typed, model.name)
            await store.add_chat_message(message, account.id)
            messages = [*messages, message]
            if conversation.title == NEW_TITLE and not any(m.role == "user" for m in messages[:-1]):
                await store.rename_conversation(conversation.id, account.id, title_from(typed))
        elif waiting is not None:  # the waiting turn again, without the notes of its failures
            messages = messages[: waiting + 1]
        body = {
            "model": model.name,
            "messages": history_messages(messages),
            "stream": True,
            "stream_options": {"include_usage": True},
        }

        async def work(emit: Emit, gone: asyncio.Event) -> None:
            out = await run_chat(request, ctx, body, emit, gone)
            if out.text:  # what the model said (and what it was charged) stays, cut short or not
                answer = new_chat_message(
                    conversation.id,
                    "assistant",
                    out.text,
                    model.name,
                    request_id=out.request_id,
                    prompt_tokens=out.prompt_tokens,
                    completion_tokens=out.completion_tokens,
                    cost=out.cost,
                )
                await store.add_chat_message(answer, account.id)
                if out.error_code is None:
                    emit({"type": "done", "message": message_json(answer), **out.usage_json()})
                    return
            # Kept to show after a reload, never sent to a model (history_messages).
            note = new_chat_message(
                conversation.id,
                FAILED,
                f"{out.error_message} ({out.error_code})",
                model.name,
                request_id=out.request_id,
            )
            await store.add_chat_message(note, account.id)
            emit(error_event(out))

        return streamed_events(work)

    def form(handler: Any) -> Any:
        return bounded_body(console.page(handler))

    def api(handler: Any) -> Any:
        return bounded_body(console.api(handler), api=True, limit=MAX_JSON_BYTES)

    account_path = "/a/{account_id}/playground"
    api_path = "/a/{account_id}/api/conversations"
    return [
        Route(account_path, console.page(playground), methods=["GET"]),
        Route(account_path + "/from-log/{log_id}", form(from_log), methods=["POST"]),
        Route(account_path + "/{conversation_id}/rename", form(rename), methods=["POST"]),
        Route(account_path + "/{conversation_id}/delete", form(delete), methods=["POST"]),
        Route(api_path, api(create), methods=["POST"]),
        Route(api_path + "/{conversation_id}/messages", api(send_message), methods=["POST"]),
    ]

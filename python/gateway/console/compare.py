"""Compare (docs/console.md): one prompt to two or three models side by side. The browser sends one
request per model, at once; each runs in process under the account's playground key exactly as the
playground's (charged and logged like any other) and streams into its own column, then reports its
time to the first token, its total time, tokens and cost. Nothing is kept but the requests' logs."""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ..errors import invalid_request
from .endpoints import Console
from .forms import bounded_body
from .playground import (
    MAX_JSON_BYTES,
    MAX_TEXT_CHARS,
    Emit,
    chat_models,
    error_event,
    pick_model,
    playground_context,
    read_json,
    run_chat,
    streamed_events,
)
from .render import page
from .security import Viewer

MAX_MODELS = 3


def routes(console: Console) -> list[BaseRoute]:
    state = console.state

    async def compare(request: Request, viewer: Viewer) -> Response:
        account = await console.account_of(request, viewer)
        models = chat_models(state, account)
        return page(request, "compare.html", viewer, account=account, models=models, slots=MAX_MODELS)

    async def run(request: Request, viewer: Viewer) -> Response:
        account = await console.account_of(request, viewer)
        payload = await read_json(request)
        prompt = payload.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise invalid_request("Write a prompt first.", "prompt")
        if len(prompt) > MAX_TEXT_CHARS:
            raise invalid_request(f"A prompt may have at most {MAX_TEXT_CHARS} characters.", "prompt")
        model = pick_model(state, account, payload.get("model"))
        ctx = await playground_context(state.store, account.id)
        body = {
            "model": model.name,
            "messages": [{"role": "user", "content": prompt}],
            "stream": True,
            "stream_options": {"include_usage": True},
        }

        async def work(emit: Emit, gone: asyncio.Event) -> None:
            out = await run_chat(request, ctx, body, emit, gone)
            if out.error_code is None:
                emit({"type": "done", "model": model.name, **out.usage_json()})
            else:
                emit({**error_event(out), "model": model.name})

        return streamed_events(work)

    return [
        Route("/a/{account_id}/compare", console.page(compare), methods=["GET"]),
        Route(
            "/a/{account_id}/api/compare",
            bounded_body(console.api(run), api=True, limit=MAX_JSON_BYTES),
            methods=["POST"],
        ),
    ]

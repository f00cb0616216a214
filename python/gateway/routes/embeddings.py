"""POST /v1/embeddings (Shape A)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .. import billing
from ..config import ModelConfig
from ..context import Call
from ..core import count_tokens
from ..errors import invalid_request
from ..ids import response_id
from ..pricing import Usage
from ..state import GatewayState
from .common import model_endpoint, parse_object, read_body, resolve_model
from .text import count_input
from .upstream import CHAT_ANSWER, answer_with_usage, forward_plain

# An answer without usage (Gemini's embeddings report none) gets OpenAI's embeddings usage with the
# tokens the gateway counted and billed (spec 1.4.1).
WITH_EMBEDDING_USAGE = answer_with_usage(
    lambda usage: {"prompt_tokens": usage.prompt_tokens, "total_tokens": usage.prompt_tokens}
)
# OpenAI's bound on the entries of one embeddings request, kept for every upstream: past it a
# request is refused before anything is counted or held (fuzz review: 400,000 inputs went upstream).
MAX_INPUTS = 2048


def routes(state: GatewayState) -> list[Route]:
    async def embeddings(request: Request, call: Call) -> Response:
        payload = parse_object(await read_body(request, state.settings.max_request_bytes))
        model = resolve_model(state, call, payload.get("model"), "embedding")
        inputs = _inputs(payload.get("input"))
        counted = await count_input(state, request, call, model, lambda: _counted_usage(model, inputs))
        await billing.hold(state, call, model, counted)
        upstream = state.registry.channel_body(model, payload, call)
        # OpenAI's embeddings answer has no id; the gateway adds one (spec 2.4), for the usage lookup.
        rid = response_id("embd-")
        return await forward_plain(
            state,
            request,
            call,
            model,
            upstream,
            rid,
            CHAT_ANSWER,
            lambda _: counted,
            add_usage=WITH_EMBEDDING_USAGE,
        )

    return [Route("/v1/embeddings", model_endpoint(state, embeddings), methods=["POST"])]


def _inputs(value: Any) -> list[str | list[int]]:
    """The input as a list of texts or token arrays, as OpenAI accepts it; anything else is refused."""
    if isinstance(value, str):
        items: list[Any] = [value]
    elif (
        isinstance(value, list)
        and value
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        items = [value]
    elif isinstance(value, list) and value:
        items = value
        if len(items) > MAX_INPUTS:
            raise invalid_request(
                f"`input` holds {len(items)} entries; at most {MAX_INPUTS} are taken in one request.", "input"
            )
    else:
        raise invalid_request(
            "`input` must be a non-empty string, array of strings or array of tokens.", "input"
        )
    for item in items:
        is_tokens = (
            isinstance(item, list)
            and item
            and all(isinstance(t, int) and not isinstance(t, bool) for t in item)
        )
        if not (isinstance(item, str) and item) and not is_tokens:
            raise invalid_request(
                "Every `input` entry must be a non-empty string or array of tokens.", "input"
            )
    return items


def _counted_usage(model: ModelConfig, inputs: list[str | list[int]]) -> Usage:
    tokens = sum(len(i) if isinstance(i, list) else count_tokens(i, model.tokenizer) for i in inputs)
    return Usage(prompt_tokens=tokens)

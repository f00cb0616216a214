"""POST /v1/moderations (Shape A): OpenAI's moderations API, for models of type `moderation` (the
openai client's `moderations.create`). The same models run the safety checks (gateway.safety)."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .. import billing
from ..context import Call
from ..core import count_tokens
from ..errors import invalid_request
from ..ids import response_id
from ..pricing import Usage
from ..state import GatewayState
from .common import model_endpoint, parse_object, read_body, resolve_model
from .text import count_input
from .upstream import CHAT_ANSWER, forward_plain

# The model of a request that names none: OpenAI's default, `openai/omni-moderation-latest` here
# (a name without its vendor is the endpoint's vendor's model: gateway.registry).
DEFAULT_MODEL = "omni-moderation-latest"


def routes(state: GatewayState) -> list[Route]:
    async def moderations(request: Request, call: Call) -> Response:
        payload = parse_object(await read_body(request, state.settings.max_request_bytes))
        # Left out, the model is OpenAI's default, as its API has it.
        named = payload.get("model") if payload.get("model") is not None else DEFAULT_MODEL
        model = resolve_model(state, call, named, "moderation")
        texts = input_texts(payload.get("input"))
        counted = Usage(
            prompt_tokens=await count_input(
                state, request, call, model, lambda: sum(count_tokens(t, model.tokenizer) for t in texts)
            )
        )
        await billing.hold(state, call, model, counted)
        return await forward_plain(
            state,
            request,
            call,
            model,
            state.registry.channel_body(model, payload, call),
            response_id("modr-"),
            CHAT_ANSWER,
            lambda _: counted,
            to_client=with_usage,
        )

    return [Route("/v1/moderations", model_endpoint(state, moderations), methods=["POST"])]


def input_texts(value: Any) -> list[str]:
    """The texts of a moderations `input` as OpenAI takes it: a string, an array of strings, or an
    array of multi-modal parts ({"type": "text", "text"} or {"type": "image_url", "image_url":
    {"url"}}); anything else is refused. Images are passed on and not counted."""
    items: list[Any] = [value] if isinstance(value, str) else value if isinstance(value, list) else []
    if not items:
        raise invalid_request(
            "`input` must be a non-empty string, array of strings or array of input parts.", "input"
        )
    texts: list[str] = []
    for item in items:
        if isinstance(item, str):
            texts.append(item)
        elif isinstance(item, dict) and item.get("type") == "text" and isinstance(item.get("text"), str):
            texts.append(item["text"])
        elif not (
            isinstance(item, dict)
            and item.get("type") == "image_url"
            and isinstance(item.get("image_url"), dict)
            and isinstance(item["image_url"].get("url"), str)
        ):
            raise invalid_request(
                "Every `input` entry must be a string, a text part or an image_url part.", "input"
            )
    return texts


def with_usage(body: bytes, usage: Usage) -> bytes:
    """OpenAI's moderations answer reports no usage; every successful answer carries it (spec
    1.4.1): the input tokens the gateway counted and billed."""
    data = orjson.loads(body)
    if isinstance(data, dict) and data.get("usage") is None:
        data["usage"] = {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": 0,
            "total_tokens": usage.prompt_tokens,
        }
    return orjson.dumps(data)

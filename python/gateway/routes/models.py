"""GET /v1/models (Shape A list; Anthropic's for the anthropic clients), GET /v1/models/{model} and
GET /model_group/info (spec 1.3.5)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..admin_fields import money_text
from ..auth import authenticate
from ..config import ModelConfig
from ..errors import GatewayError, invalid_request
from ..state import GatewayState
from .common import json_response

# The anthropic clients send it on every request: their `models.list()` and `models.retrieve()` get
# Anthropic's model objects, and a bare name is Anthropic's model of that name.
ANTHROPIC_VERSION = "anthropic-version"
ANTHROPIC_PAGE = 20  # Anthropic's default page; at most 1,000
ANTHROPIC_MAX_PAGE = 1000


def routes(state: GatewayState) -> list[Route]:
    async def list_models(request: Request) -> Response:
        ctx = await authenticate(request, state.store)
        models = state.registry.visible(ctx)
        if ANTHROPIC_VERSION in request.headers:
            return json_response(_anthropic_page(models, request.query_params))
        return json_response({"object": "list", "data": [_model_entry(m) for m in models]})

    async def model_group_info(request: Request) -> Response:
        ctx = await authenticate(request, state.store)
        name = request.query_params.get("model_group")
        models = (
            [state.registry.lookup(name, ctx, "model_group", vendor="openai")]
            if name is not None
            else state.registry.visible(ctx)
        )
        return json_response({"data": [_group_info(state, m) for m in models]})

    async def retrieve_model(request: Request) -> Response:
        """GET /v1/models/{model} (the openai client's models.retrieve): one entry of the list."""
        name = request.path_params["model"]
        if not name:  # "/v1/models/": a slash too many, an unknown path as every other
            raise GatewayError("not_found", f"No such path: {request.url.path}.")
        ctx = await authenticate(request, state.store)
        if ANTHROPIC_VERSION in request.headers:
            return json_response(_anthropic_entry(state.registry.lookup(name, ctx, vendor="anthropic")))
        return json_response(_model_entry(state.registry.lookup(name, ctx, vendor="openai")))

    return [
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", retrieve_model, methods=["GET"]),
        Route("/model_group/info", model_group_info, methods=["GET"]),
    ]


def _model_entry(model: ModelConfig) -> dict[str, Any]:
    # `created` is when the model was made; the gateway does not know it, so it says 0.
    return {"id": model.name, "object": "model", "created": 0, "owned_by": model.name.split("/", 1)[0]}


def _anthropic_entry(model: ModelConfig) -> dict[str, Any]:
    # `created_at` is when the model was released, which the gateway does not know (as `created`).
    return {
        "type": "model",
        "id": model.name,
        "display_name": model.name,
        "created_at": "1970-01-01T00:00:00Z",
    }


def _anthropic_page(models: list[ModelConfig], query: Mapping[str, str]) -> dict[str, Any]:
    """Anthropic's list of models: a page of `limit` after `after_id` or before `before_id`, in the
    list's order; an id that is not in the list starts an empty page."""
    given = query.get("limit")
    if given is not None and not (given.isdigit() and 1 <= int(given) <= ANTHROPIC_MAX_PAGE):
        raise invalid_request(f"`limit` must be an integer from 1 to {ANTHROPIC_MAX_PAGE}.", "limit")
    limit = int(given) if given is not None else ANTHROPIC_PAGE
    names = [m.name for m in models]
    after, before = query.get("after_id"), query.get("before_id")
    if after is not None:
        start = names.index(after) + 1 if after in names else len(names)
        page, more = models[start : start + limit], start + limit < len(models)
    elif before is not None:
        end = names.index(before) if before in names else 0
        page, more = models[max(end - limit, 0) : end], end - limit > 0
    else:
        page, more = models[:limit], limit < len(models)
    return {
        "data": [_anthropic_entry(m) for m in page],
        "has_more": more,
        "first_id": page[0].name if page else None,
        "last_id": page[-1].name if page else None,
    }


def _group_info(state: GatewayState, model: ModelConfig) -> dict[str, Any]:
    prices = model.prices
    return {
        "model_group": model.name,
        "mode": model.type,
        "providers": sorted({c.provider for c in model.channels}),
        "max_output_tokens": model.max_output_tokens,
        "input_cost_per_million_tokens": money_text(prices.input),
        "cached_input_cost_per_million_tokens": money_text(prices.cached_input),
        "cache_write_cost_per_million_tokens": money_text(prices.cache_write),
        "cache_write_1h_cost_per_million_tokens": money_text(prices.cache_write_1h),
        "audio_input_cost_per_million_tokens": money_text(prices.audio_input),
        "image_input_cost_per_million_tokens": money_text(prices.image_input),
        "output_cost_per_million_tokens": money_text(prices.output),
        "reasoning_cost_per_million_tokens": money_text(prices.reasoning),
        "audio_output_cost_per_million_tokens": money_text(prices.audio_output),
        # The prices of models billed by other units (0 where a model has none).
        "cost_per_search_unit": money_text(prices.search),
        "input_cost_per_million_characters": money_text(prices.character),
        "cost_per_second": money_text(prices.second),
        "cost_per_minute": money_text(prices.minute),
        "cost_per_image": money_text(prices.image),
        "cost_per_image_by_variant": {variant: money_text(price) for variant, price in prices.images},
        "supported_openai_params": sorted(state.registry.forwarded_params(model)),
    }

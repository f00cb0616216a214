"""POST /v1/rerank (Shape C): documents scored and ordered by relevance to a query.

Served at every path the official cohere clients build from either base address the spec allows
(the root, or {base_url}/v1 as spec 1.2 gives Shape C): `Client` (v1) appends v1/rerank and
`ClientV2` appends v2/rerank. The body is the same on all four.
"""

from __future__ import annotations

from typing import Any

import orjson
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
from .upstream import forward_plain, stamped_answer


def routes(state: GatewayState) -> list[Route]:
    async def rerank(request: Request, call: Call) -> Response:
        payload = parse_object(await read_body(request, state.settings.max_request_bytes))
        model = resolve_model(state, call, payload.get("model"), "rerank")
        texts = _validate(payload)
        counted = await count_input(state, request, call, model, lambda: _counted(model, payload, texts))
        await billing.hold(state, call, model, counted)
        upstream = state.registry.channel_body(model, payload, call)
        rid = response_id("rerank-")
        return await forward_plain(
            state,
            request,
            call,
            model,
            upstream,
            rid,
            stamped_answer(_reported_usage),
            lambda _: counted,
            _with_usage,
        )

    endpoint = model_endpoint(state, rerank)
    return [Route(path, endpoint, methods=["POST"]) for path in PATHS]


# {base}/v1/rerank and {base}/v2/rerank from the root; the same under /v1 from {base_url}/v1.
PATHS = ("/v1/rerank", "/v2/rerank", "/v1/v1/rerank", "/v1/v2/rerank")


def _validate(payload: dict[str, Any]) -> list[str]:
    """The documents' texts; refuses what the rerank APIs refuse."""
    query = payload.get("query")
    if not isinstance(query, str) or not query:
        raise invalid_request("`query` must be a non-empty string.", "query")
    documents = payload.get("documents")
    if not isinstance(documents, list) or not documents:
        raise invalid_request("`documents` must be a non-empty array.", "documents")
    fields = payload.get("rank_fields")
    if fields is not None and (
        not isinstance(fields, list) or not fields or not all(isinstance(f, str) and f for f in fields)
    ):
        raise invalid_request("`rank_fields` must be a non-empty array of field names.", "rank_fields")
    texts = []
    for index, doc in enumerate(documents):
        if isinstance(doc, str):
            texts.append(doc)
        elif isinstance(doc, dict) and fields is not None:
            texts.append(_ranked_text(doc, fields, index))
        elif isinstance(doc, dict) and isinstance(doc.get("text"), str):
            texts.append(doc["text"])
        else:
            raise invalid_request(
                "Each document must be a string, an object with `text`, or an object with the"
                " fields `rank_fields` names.",
                "documents",
            )
    top_n = payload.get("top_n")
    if top_n is not None and (not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 1):
        raise invalid_request("`top_n` must be a positive integer.", "top_n")
    return texts


def _ranked_text(document: dict[str, Any], fields: list[str], index: int) -> str:
    """What Cohere ranks of an object document given `rank_fields` (its v1 API): the values of
    those fields in their order, each a string; a field the document lacks is left out. Counted
    as `name: value` lines, about what the model reads."""
    lines = []
    for field in fields:
        value = document.get(field)
        if value is None:
            continue
        if not isinstance(value, str):
            raise invalid_request(
                f"The field {field!r} of a document that `rank_fields` names must be a string.",
                f"documents[{index}].{field}",
            )
        lines.append(f"{field}: {value}")
    if not lines:
        raise invalid_request("A document has none of the fields `rank_fields` names.", f"documents[{index}]")
    return "\n".join(lines)


def _reported_usage(body: bytes) -> Usage | None:
    """Cohere bills search units (meta.billed_units); Jina-style servers report usage.total_tokens."""
    data = orjson.loads(body)
    meta = data.get("meta") if isinstance(data, dict) else None
    billed = meta.get("billed_units") if isinstance(meta, dict) else None
    usage = data.get("usage") if isinstance(data, dict) else None
    if isinstance(billed, dict) and isinstance(billed.get("search_units"), int | float):
        tokens = meta.get("tokens") if isinstance(meta, dict) else None
        prompt = tokens.get("input_tokens") if isinstance(tokens, dict) else None
        return Usage(prompt_tokens=int(prompt or 0), searches=int(billed["search_units"]))
    if isinstance(usage, dict) and isinstance(usage.get("total_tokens"), int):
        return Usage(prompt_tokens=usage["total_tokens"], searches=1)
    return None


def _with_usage(body: bytes, usage: Usage) -> bytes:
    """The answer with a `usage` object (spec 1.4.1) beside Cohere's own `meta`, which is kept:
    the tokens and search units the request is billed for."""
    data = orjson.loads(body)
    if not isinstance(data, dict):
        return body
    data["usage"] = {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": 0,
        "total_tokens": usage.prompt_tokens,
        "search_units": usage.searches,
    }
    return orjson.dumps(data)


# Cohere splits a document longer than this with the query into chunks of it, each billed as a
# document of its own (review: a hold of one search for 100 long documents was many searches).
CHUNK_TOKENS = 500


def _counted(model: ModelConfig, payload: dict[str, Any], texts: list[str]) -> Usage:
    """One search per 100 documents, as Cohere bills, a document longer than CHUNK_TOKENS with the
    query counting as one per chunk; tokens of the query with every document."""
    query_tokens = count_tokens(payload["query"], model.tokenizer)
    tokens = chunks = 0
    for text in texts:
        each = query_tokens + count_tokens(text, model.tokenizer)
        tokens += each
        chunks += max(1, -(-each // CHUNK_TOKENS))
    return Usage(prompt_tokens=tokens, searches=-(-chunks // 100))

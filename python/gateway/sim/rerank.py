"""Cohere's rerank API (POST .../rerank): relevance is the share of the query's words a document
contains, with a tie-break from a hash of the document."""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from ..core import count_tokens
from .wire import bad_json, json_object, openai_error, reply

if TYPE_CHECKING:
    from .state import Simulator

_WORD = re.compile(r"\w+")


async def create(sim: Simulator, request: web.Request) -> web.StreamResponse:
    body = await request.read()
    req = json_object(body)
    if req is None:
        return bad_json()
    query, documents = req.get("query"), req.get("documents")
    if not isinstance(query, str) or not isinstance(documents, list) or not documents:
        return openai_error(400, "query and documents are required")
    sim.record({"path": "/v1/rerank", "body": req})
    fields = req.get("rank_fields")
    texts = [_ranked(d, fields if isinstance(fields, list) and fields else None) for d in documents]
    words = set(_WORD.findall(query.lower()))
    scored = []
    for index, text in enumerate(texts):
        overlap = len(words & set(_WORD.findall(text.lower()))) / (len(words) or 1)
        tie = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=2).digest()) / 65535 / 1000
        scored.append((round(min(overlap * 0.998 + tie, 1.0), 6), index))
    scored.sort(key=lambda s: (-s[0], s[1]))
    top_n = req.get("top_n")
    if isinstance(top_n, int) and top_n > 0:
        scored = scored[:top_n]
    results = []
    for score, index in scored:
        result: dict[str, Any] = {"index": index, "relevance_score": score}
        if req.get("return_documents"):  # as it was sent: an object whole
            sent = documents[index]
            result["document"] = sent if isinstance(sent, dict) else {"text": sent}
        results.append(result)
    each = [count_tokens(query) + count_tokens(t) for t in texts]
    # As Cohere bills: a search per 100 documents, a document longer than 500 tokens with the query
    # counting once per 500-token chunk.
    chunks = sum(max(1, -(-n // 500)) for n in each)
    meta = {
        "api_version": {"version": "1"},
        "billed_units": {"search_units": -(-chunks // 100)},
        "tokens": {"input_tokens": sum(each)},
    }
    rid = "rerank-sim" + hashlib.blake2b(body, digest_size=8).hexdigest()
    return reply(200, orjson.dumps({"id": rid, "results": results, "meta": meta}))


def _ranked(document: Any, fields: list[Any] | None) -> str:
    """What is ranked of a document: itself, its `text`, or the `rank_fields` it has, one
    `name: value` line each (Cohere's v1 API)."""
    if isinstance(document, str):
        return document
    if not isinstance(document, dict):
        return ""
    if fields is None:
        return str(document.get("text", ""))
    return "\n".join(f"{f}: {document[f]}" for f in fields if isinstance(f, str) and f in document)

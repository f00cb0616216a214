"""OpenAI's moderations API (POST /v1/moderations), deterministic: the same input, the same answer.

An input is flagged when it carries a `[sim flag]` marker (`[sim flag=hate,violence]` names the
categories; `violence` by default). Every category's score comes from a hash of the input and the
category: below 0.01 when not flagged, above 0.9 when flagged. A string input gives one result, an
array of strings one result each, an array of multi-modal parts one result for all of them (as
OpenAI answers). `fail=STATUS` is read from the model name (`omni-moderation-latest+fail=503`) or
the x-sim header only, never from the input: a marker there is for the model the text goes to next.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any, Final

import orjson
from aiohttp import web

from . import directives
from .directives import DirectiveError, Directives
from .wire import Headers, openai_error_body, reply

if TYPE_CHECKING:
    from .state import Simulator

# Categories and the input types each applies to, as omni-moderation answers.
CATEGORIES: Final = {
    "harassment": ("text",),
    "harassment/threatening": ("text",),
    "hate": ("text",),
    "hate/threatening": ("text",),
    "illicit": ("text",),
    "illicit/violent": ("text",),
    "self-harm": ("text", "image"),
    "self-harm/intent": ("text", "image"),
    "self-harm/instructions": ("text", "image"),
    "sexual": ("text", "image"),
    "sexual/minors": ("text",),
    "violence": ("text", "image"),
    "violence/graphic": ("text", "image"),
}
DEFAULT_MODEL: Final = "omni-moderation-latest"


async def create(sim: Simulator, request: web.Request) -> web.StreamResponse:
    """POST .../moderations."""
    status, body, record = moderate(request.headers, await request.read())
    sim.record(record)
    return reply(status, body)


def moderate(headers: Headers, body: bytes) -> tuple[int, bytes, dict[str, Any] | None]:
    """(status, JSON body, the request as /_sim/requests records it)."""
    try:
        req = orjson.loads(body)
    except orjson.JSONDecodeError:
        req = None
    if not isinstance(req, dict):
        return 400, _error("We could not parse the JSON body of your request."), None
    inputs = _inputs(req.get("input"))
    model = req.get("model", DEFAULT_MODEL)
    if inputs is None or not isinstance(model, str):
        return 400, _error("'input' must be a string, an array of strings or of input parts."), None
    record = {"path": "/v1/moderations", "body": req}
    try:
        # fail= comes from the model name or the header only: a marker in the text is meant for
        # the model the text goes to next, except `flag`, which is the moderation model's.
        base, own = directives.parse(model, headers.get("x-sim"), None)
        if own.fail is not None:
            return own.fail, openai_error_body(f"Simulated failure {own.fail}.", "server_error"), record
        results = [
            _result(text, kinds, directives.parse(model, headers.get("x-sim"), text)[1])
            for text, kinds in inputs
        ]
    except DirectiveError as exc:
        return 400, _error(str(exc)), record
    rid = "modr-sim" + hashlib.blake2b(body, digest_size=10).hexdigest()
    return 200, orjson.dumps({"id": rid, "model": base, "results": results}), record


def _error(message: str) -> bytes:
    return openai_error_body(message, "invalid_request_error")


def _inputs(value: Any) -> list[tuple[str, tuple[str, ...]]] | None:
    """(text, input types) for each result the answer has."""
    if isinstance(value, str):
        return [(value, ("text",))]
    if not isinstance(value, list) or not value:
        return None
    if all(isinstance(v, str) for v in value):
        return [(v, ("text",)) for v in value]
    texts: list[str] = []
    kinds: set[str] = set()
    for part in value:
        if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
            kinds.add("text")
        elif isinstance(part, dict) and part.get("type") == "image_url":
            kinds.add("image")
        else:
            return None
    return [(" ".join(texts), tuple(sorted(kinds, reverse=True)))]


def _result(text: str, kinds: tuple[str, ...], d: Directives) -> dict[str, Any]:
    flagged = set(d.flag.split(",")) if d.flag else set()
    unknown = flagged - set(CATEGORIES)
    if unknown:
        raise DirectiveError(f"unknown moderation categories {sorted(unknown)}")
    scores = {}
    for name in CATEGORIES:
        digest = hashlib.blake2b(f"{name}\0{text}".encode(), digest_size=4).digest()
        fraction = int.from_bytes(digest) / 2**32
        scores[name] = round(0.9 + 0.0999 * fraction if name in flagged else 0.01 * fraction, 8)
    return {
        "flagged": bool(flagged),
        "categories": {name: name in flagged for name in CATEGORIES},
        "category_scores": scores,
        "category_applied_input_types": {
            name: [k for k in kinds if k in applies] for name, applies in CATEGORIES.items()
        },
    }

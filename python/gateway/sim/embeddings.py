"""OpenAI's Embeddings API (POST .../embeddings): a deterministic unit vector per input, as floats or
base64, of the requested dimensions."""

from __future__ import annotations

import base64
import hashlib
import struct
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from ..core import count_tokens
from .wire import bad_json, json_object, openai_error, reply

if TYPE_CHECKING:
    from .state import Simulator

DEFAULT_DIMENSIONS = 64
# The most dimensions it makes (text-embedding-3-large's size): more is OpenAI's 400, not a vector
# of a billion floats that would take the simulator's memory.
MAX_DIMENSIONS = 3072


async def create(sim: Simulator, request: web.Request) -> web.StreamResponse:
    body = await request.read()
    req = json_object(body)
    if req is None:
        return bad_json()
    raw = req.get("input")
    # One string or one list of token ids is one input; any other list is one input per item.
    one = isinstance(raw, str) or (isinstance(raw, list) and raw and isinstance(raw[0], int))
    items = [raw] if one else raw
    if not isinstance(items, list) or not items or not isinstance(req.get("model"), str):
        return openai_error(400, "'model' and 'input' are required.")
    sim.record({"path": "/v1/embeddings", "body": req})
    requested = req.get("dimensions")
    dims: int = requested if isinstance(requested, int) and requested > 0 else DEFAULT_DIMENSIONS
    if dims > MAX_DIMENSIONS:
        return openai_error(
            400,
            f"Invalid value for 'dimensions' = {dims}. Must be less than or equal to {MAX_DIMENSIONS}.",
            param="dimensions",
        )
    as_base64 = req.get("encoding_format") == "base64"
    data = []
    tokens = 0
    for index, item in enumerate(items):
        text = item if isinstance(item, str) else " ".join(map(str, item))
        tokens += count_tokens(text) if isinstance(item, str) else len(item)
        values = vector(text.encode(), dims)
        embedding: Any = base64.b64encode(struct.pack(f"<{dims}f", *values)).decode() if as_base64 else values
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return reply(200, orjson.dumps({"object": "list", "data": data, "model": req["model"], "usage": usage}))


def vector(seed: bytes, dims: int) -> list[float]:
    """A deterministic unit vector for a text (float32-exact, so base64 and floats agree)."""
    digest = hashlib.shake_256(seed).digest(dims * 2)
    raw = [int.from_bytes(digest[i : i + 2]) / 65535 - 0.5 for i in range(0, dims * 2, 2)]
    norm = sum(v * v for v in raw) ** 0.5 or 1.0
    return [struct.unpack("<f", struct.pack("<f", v / norm))[0] for v in raw]

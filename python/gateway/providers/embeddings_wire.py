"""OpenAI's embeddings wire format as providers of another format read and write it (gemini.py's
batchEmbedContents, vertex.py's predict): the texts of a request, and the answer's list of vectors."""

from __future__ import annotations

import base64
import struct
from typing import Any

import orjson

from ..errors import invalid_request


def input_texts(payload: dict[str, Any], provider: str) -> list[str]:
    """The request's `input` as texts; token arrays (which only OpenAI's tokenizer gives meaning)
    are refused, naming the provider that embeds texts."""
    raw = payload.get("input")
    texts = [raw] if isinstance(raw, str) else raw if isinstance(raw, list) else []
    if not texts or not all(isinstance(t, str) for t in texts):
        raise invalid_request(
            f"{provider} embeds texts: `input` must be a string or an array of strings.", "input"
        )
    return texts


def embedding_list(
    vectors: list[list[float]], request: bytes, model: str, prompt_tokens: int | None = None
) -> bytes:
    """OpenAI's answer: each vector as floats or base64 (little-endian float32), as the request's
    encoding_format asked; `usage` when the provider counted the input (else the gateway adds its
    own count, routes/embeddings.py)."""
    as_base64 = orjson.loads(request).get("encoding_format") == "base64"
    data = [
        {
            "object": "embedding",
            "index": i,
            "embedding": base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode() if as_base64 else v,
        }
        for i, v in enumerate(vectors)
    ]
    answer: dict[str, Any] = {"object": "list", "data": data, "model": model}
    if prompt_tokens is not None:
        answer["usage"] = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
    return orjson.dumps(answer)

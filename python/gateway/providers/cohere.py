"""Cohere's rerank API and every server that speaks it (Jina and others use the same shape)."""

from __future__ import annotations

from typing import Final

from ..config import ChannelConfig
from .base import bearer_headers, no_stream_translation, nothing_to_check, unchanged, unchanged_answer

# "model", "query" and "documents" are the request itself: they always go.
RERANK_PARAMS: Final = frozenset(
    {"max_chunks_per_doc", "max_tokens_per_doc", "priority", "rank_fields", "return_documents", "top_n"}
)
PARAMS: Final = {"rerank": RERANK_PARAMS}
PARAMS_BY_MODEL: Final[dict[tuple[str, str], frozenset[str]]] = {}
# The base URL is the host (https://api.cohere.com); /v1/rerank takes strings or {"text": ...} documents.
PATHS: Final = {"rerank": "/v1/rerank"}


def url(channel: ChannelConfig, model_type: str, *, stream: bool = False) -> str:
    return channel.base_url + PATHS[model_type]


headers = bearer_headers


# The upstream speaks the model type's own wire format.
encode = unchanged
check = nothing_to_check
decode = unchanged_answer
stream_translator = no_stream_translation

"""Google Vertex AI: Gemini models (`chat`), Anthropic's models (`messages`) and Google's embedding
models (`embedding`) in a Google Cloud project, signed in with Google's credentials.

  {base_url}/v1/projects/{project}/locations/{location}/publishers/...
    Gemini:     .../google/models/{model}:generateContent    (streamed: :streamGenerateContent?alt=sse)
    Anthropic:  .../anthropic/models/{model}:rawPredict      (streamed: :streamRawPredict)
    Embeddings: .../google/models/{model}:predict            (instances of content, token counts back)

`base_url` is the regional endpoint (https://us-east5-aiplatform.googleapis.com, or
https://aiplatform.googleapis.com for location "global"). The bearer token comes from google-auth
(credentials.py): the channel's `credentials_file` (a service account key), else the application
default credentials. Gemini's bodies, answers and streams are the Generative Language API's
(gemini.py); Anthropic's are the Messages API's, with the model in the URL instead of the body and
`anthropic_version: vertex-2023-10-16`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import quote

import orjson

from ..config import ChannelConfig
from ..errors import GatewayError
from ..translate.usage import token_count
from . import anthropic, gemini
from .credentials import GOOGLE_TOKENS
from .embeddings_wire import embedding_list, input_texts
from .http import UpstreamClient

PARAMS: Final = {
    "chat": gemini.PARAMS["chat"],
    "messages": anthropic.PARAMS["messages"],
    "embedding": gemini.PARAMS["embedding"],
}
PARAMS_BY_MODEL: Final[dict[tuple[str, str], frozenset[str]]] = {}
PATHS: Final = {"chat": ":generateContent", "messages": ":rawPredict", "embedding": ":predict"}
ANTHROPIC_VERSION = "vertex-2023-10-16"


def url(channel: ChannelConfig, model_type: str, *, stream: bool = False) -> str:
    model = quote(channel.upstream_model, safe="")
    base = f"{channel.base_url}/v1/projects/{channel.project}/locations/{channel.location}/publishers"
    if model_type == "messages":
        return f"{base}/anthropic/models/{model}:{'streamRawPredict' if stream else 'rawPredict'}"
    if model_type == "embedding":
        return f"{base}/google/models/{model}:predict"
    return f"{base}/google/models/{model}:{'streamGenerateContent?alt=sse' if stream else 'generateContent'}"


async def headers(
    channel: ChannelConfig,
    client_headers: Mapping[str, str],
    upstream: UpstreamClient,
    *,
    url: str = "",
    body: bytes = b"",
) -> dict[str, str]:
    token = await GOOGLE_TOKENS.bearer(channel.credentials_file)
    return {
        "content-type": "application/json",
        "accept": "application/json",
        "authorization": f"Bearer {token}",
    }


def check(model_type: str, payload: dict[str, Any]) -> None:
    """Gemini's checks for its chat models; a messages model's request is Anthropic's own."""
    gemini.check(model_type, payload)


def encode(channel: ChannelConfig, operation: str, body: bytes) -> bytes:
    if operation == "embedding":
        return _predict_request(orjson.loads(body))
    if operation != "messages":
        return gemini.encode(channel, operation, body)
    request = orjson.loads(body)
    request.pop("model", None)  # the URL names it
    request.setdefault("anthropic_version", ANTHROPIC_VERSION)
    return orjson.dumps(request)


def decode(channel: ChannelConfig, operation: str, content: bytes, request: bytes) -> bytes:
    if operation == "embedding":
        return _embeddings(channel, content, request)
    return content if operation == "messages" else gemini.decode(channel, operation, content, request)


def stream_translator(channel: ChannelConfig, operation: str) -> gemini.GeminiStreamToChat | None:
    return None if operation == "messages" else gemini.stream_translator(channel, operation)


# ------------------------------------------------------------------ embeddings (the predict API)


def _predict_request(payload: dict[str, Any]) -> bytes:
    """OpenAI's embeddings body as predict's: one instance per text. autoTruncate is off, so a text
    longer than the model takes is the upstream's 400 (as OpenAI refuses it), not silently cut."""
    parameters: dict[str, Any] = {"autoTruncate": False}
    dimensions = payload.get("dimensions")
    if isinstance(dimensions, int) and not isinstance(dimensions, bool):
        parameters["outputDimensionality"] = dimensions
    instances = [{"content": text} for text in input_texts(payload, "Vertex AI")]
    return orjson.dumps({"instances": instances, "parameters": parameters})


def _embeddings(channel: ChannelConfig, content: bytes, request: bytes) -> bytes:
    """predict's answer as OpenAI's, with the usage Vertex counted (each prediction's token_count)."""
    try:
        predictions = orjson.loads(content)["predictions"]
        vectors = [p["embeddings"]["values"] for p in predictions]
        tokens = sum(
            token_count(p["embeddings"].get("statistics", {}).get("token_count")) for p in predictions
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise GatewayError("provider_error", "The model's provider sent a malformed answer.") from exc
    return embedding_list(vectors, request, channel.upstream_model, tokens)

"""Google Vertex AI: Gemini models (`chat`) and Anthropic's models (`messages`) in a Google Cloud
project, signed in with Google's credentials.

  {base_url}/v1/projects/{project}/locations/{location}/publishers/...
    Gemini:     .../google/models/{model}:generateContent    (streamed: :streamGenerateContent?alt=sse)
    Anthropic:  .../anthropic/models/{model}:rawPredict      (streamed: :streamRawPredict)

`base_url` is the regional endpoint (https://us-east5-aiplatform.googleapis.com, or
https://aiplatform.googleapis.com for location "global"). The bearer token comes from google-auth
(credentials.py): the channel's `credentials_file` (a service account key), else the application
default credentials. Gemini's bodies, answers and streams are the Generative Language API's
(gemini.py); Anthropic's are the Messages API's, with the model in the URL instead of the body and
`anthropic_version: vertex-2023-10-16`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final
from urllib.parse import quote

import orjson

from ..config import ChannelConfig
from . import anthropic, gemini
from .credentials import GOOGLE_TOKENS
from .http import UpstreamClient

PARAMS: Final = {"chat": gemini.PARAMS["chat"], "messages": anthropic.PARAMS["messages"]}
PATHS: Final = {"chat": ":generateContent", "messages": ":rawPredict"}
ANTHROPIC_VERSION = "vertex-2023-10-16"


def url(channel: ChannelConfig, model_type: str, *, stream: bool = False) -> str:
    model = quote(channel.upstream_model, safe="")
    base = f"{channel.base_url}/v1/projects/{channel.project}/locations/{channel.location}/publishers"
    if model_type == "messages":
        return f"{base}/anthropic/models/{model}:{'streamRawPredict' if stream else 'rawPredict'}"
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


def encode(channel: ChannelConfig, operation: str, body: bytes) -> bytes:
    if operation != "messages":
        return gemini.encode(channel, operation, body)
    request = orjson.loads(body)
    request.pop("model", None)  # the URL names it
    request.setdefault("anthropic_version", ANTHROPIC_VERSION)
    return orjson.dumps(request)


def decode(channel: ChannelConfig, operation: str, content: bytes, request: bytes) -> bytes:
    return content if operation == "messages" else gemini.decode(channel, operation, content, request)


def stream_translator(channel: ChannelConfig, operation: str) -> gemini.GeminiStreamToChat | None:
    return None if operation == "messages" else gemini.stream_translator(channel, operation)

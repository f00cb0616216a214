"""The message-style family's native API (Anthropic Messages)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from ..config import ChannelConfig
from .base import no_stream_translation, nothing_to_check, unchanged, unchanged_answer
from .http import UpstreamClient

# Messages parameters the native API accepts (spec 1.3 default list): every body field of the
# official SDK's request types (anthropic-sdk-python types/message_create_params.py and its beta
# twin). "model", "messages" and "max_tokens" are the request itself: they always go.
# `output_config` carries structured output (`format`) and `effort`; `output_format` is the beta's
# older name for the same format, still sent by some clients (with an `anthropic-beta` header).
# Left out: what changes the price the provider bills (`service_tier`, `speed`'s fast mode at six
# times, `inference_geo` at 1.1 times), which the gateway's one price per model would not follow; an
# operator who wants them lists them in a model's supported_params and prices that model for them.
MESSAGES_PARAMS: Final = frozenset(
    {
        "cache_control",
        "container",
        "context_management",
        "mcp_servers",
        "metadata",
        "output_config",
        "output_format",
        "stop_sequences",
        "stream",
        "system",
        "temperature",
        "thinking",
        "tool_choice",
        "tools",
        "top_k",
        "top_p",
        "user_profile_id",
    }
)
PARAMS: Final = {"messages": MESSAGES_PARAMS}
PARAMS_BY_MODEL: Final[dict[tuple[str, str], frozenset[str]]] = {}
PATHS: Final = {"messages": "/v1/messages"}
# The API version the gateway speaks when the client names none.
DEFAULT_VERSION = "2023-06-01"


def url(channel: ChannelConfig, model_type: str, *, stream: bool = False) -> str:
    # Anthropic's base URL is the host (https://api.anthropic.com); the path carries /v1.
    return channel.base_url + PATHS[model_type]


async def headers(
    channel: ChannelConfig,
    client_headers: Mapping[str, str],
    upstream: UpstreamClient,
    *,
    url: str = "",
    body: bytes = b"",
) -> dict[str, str]:
    out = {
        "content-type": "application/json",
        "accept": "application/json",
        "anthropic-version": client_headers.get("anthropic-version", DEFAULT_VERSION),
    }
    beta = client_headers.get("anthropic-beta")
    if beta:
        out["anthropic-beta"] = beta
    key = channel.api_key()
    if key:
        out["x-api-key"] = key
    return out


# The upstream speaks the model type's own wire format.
encode = unchanged
check = nothing_to_check
decode = unchanged_answer
stream_translator = no_stream_translation

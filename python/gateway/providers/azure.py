"""Azure OpenAI: OpenAI's wire format behind Azure's URLs, sign-in and content filters.

URLs: with the channel's `api_version`, the deployment style,
`{base_url}/openai/deployments/{model}/chat/completions?api-version={api_version}` (the channel's
`model` is the deployment's name); without it, the v1 API, `{base_url}/openai/v1/chat/completions`,
where the body's `model` names the deployment. Sign-in: the `api-key` header (api_key_env), or an
Entra ID bearer token from the channel's client credentials (providers/credentials.py).

Errors are OpenAI's with Azure's codes: a prompt refused by Azure's content filter (400
`content_filter`) is the spec's `content_filtered` (providers/base.py); an answer the filter cut
ends with finish_reason `content_filter`, which the chat shape passes on as OpenAI does and the
messages shape reads as `refusal` (translate/stop_reasons.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from ..config import ChannelConfig
from . import openai
from .base import no_stream_translation, nothing_to_check, unchanged, unchanged_answer
from .credentials import TOKENS
from .http import UpstreamClient

# The kinds of model Azure OpenAI serves with OpenAI's request bodies (no moderations endpoint; its
# video API is a different one).
PARAMS: Final = {
    kind: openai.PARAMS[kind]
    for kind in ("chat", "embedding", "image", "responses", "speech", "transcription")
}
PARAMS_BY_MODEL: Final = openai.PARAMS_BY_MODEL  # deployments are mostly named after their model
PATHS: Final = {kind: path for kind, path in openai.PATHS.items() if kind in PARAMS or kind == "image_edit"}


def url(channel: ChannelConfig, model_type: str, *, stream: bool = False) -> str:
    path = PATHS[model_type]
    if channel.api_version is None:
        return f"{channel.base_url}/openai/v1{path}"
    return (
        f"{channel.base_url}/openai/deployments/{channel.upstream_model}{path}"
        f"?api-version={channel.api_version}"
    )


def resource_url(channel: ChannelConfig, path: str) -> str:
    """Where a resource Azure keeps (a stored or background response) lives, `path` below the API's
    root: `/openai/v1/responses/{id}`, or with the channel's api_version
    `/openai/responses/{id}?api-version=...` (Azure's Responses API is not per deployment)."""
    if channel.api_version is None:
        return f"{channel.base_url}/openai/v1{path}"
    joiner = "&" if "?" in path else "?"
    return f"{channel.base_url}/openai{path}{joiner}api-version={channel.api_version}"


async def headers(
    channel: ChannelConfig,
    client_headers: Mapping[str, str],
    upstream: UpstreamClient,
    *,
    url: str = "",
    body: bytes = b"",
) -> dict[str, str]:
    out = {"content-type": "application/json", "accept": "application/json"}
    if channel.oauth is not None:
        out["authorization"] = "Bearer " + await TOKENS.bearer(channel.oauth, upstream)
    else:
        key = channel.api_key()
        if key:
            out["api-key"] = key
    return out


# The upstream speaks the model type's own wire format.
encode = unchanged
check = nothing_to_check
decode = unchanged_answer
stream_translator = no_stream_translation

"""Upstream adapters, one module per provider kind; `PROVIDERS` maps a channel's kind to its adapter.

Each adapter module is a `Provider`: PARAMS (model type -> the parameters it forwards by default,
spec 1.3; a model's `supported_params` overrides them), PARAMS_BY_MODEL (the same for models whose
upstream name says they take others), PATHS (model type -> upstream path),
url(channel, type) and headers(channel, client_headers). Sending and error mapping are shared
(base.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, Protocol

from . import anthropic, azure, bedrock, cohere, gemini, openai, vertex

if TYPE_CHECKING:
    from ..config import ChannelConfig
    from .http import UpstreamClient


class Provider(Protocol):
    """What the gateway asks of an upstream kind; type checking holds each adapter module to it."""

    @property
    def PARAMS(self) -> Mapping[str, frozenset[str]]:
        """Model type -> the request parameters forwarded by default."""

    @property
    def PARAMS_BY_MODEL(self) -> Mapping[tuple[str, str], frozenset[str]]:
        """(model type, upstream model name prefix) -> the parameters forwarded by default to the
        models so named, where they differ from their type's (GPT image models refuse DALL-E's)."""

    @property
    def PATHS(self) -> Mapping[str, str]:
        """Model type -> the upstream path, below the channel's base URL."""

    def url(self, channel: ChannelConfig, model_type: str, *, stream: bool = False) -> str:
        """Where a request of this model type goes (a streamed one, for providers whose streams
        have their own URL)."""

    async def headers(
        self,
        channel: ChannelConfig,
        client_headers: Mapping[str, str],
        upstream: UpstreamClient,
        *,
        url: str = "",
        body: bytes = b"",
    ) -> dict[str, str]:
        """The upstream request's headers: credentials (a token fetched through `upstream` when the
        channel signs in with one, or a signature of `url` and `body`) and what the provider needs
        of the client's."""

    def check(self, model_type: str, payload: dict[str, Any]) -> None:
        """Refuse (400) a request of this model type that the upstream cannot be asked, before it
        is held (a provider that says requests in another API: what encode would refuse)."""

    def encode(self, channel: ChannelConfig, operation: str, body: bytes) -> bytes:
        """The request body in the upstream's wire format, from the model type's own."""

    def decode(self, channel: ChannelConfig, operation: str, content: bytes, request: bytes) -> bytes:
        """The upstream's answer in the model type's own shape; `request` is what was asked, in that
        shape (before encode)."""

    def stream_translator(self, channel: ChannelConfig, operation: str) -> StreamTranslator | None:
        """A translator of the upstream's stream into the model type's own SSE, or None when the
        stream is already in it."""


class StreamTranslator(Protocol):
    """Turns an upstream's stream (any framing) into the model type's own SSE bytes; errors in the
    upstream's framing come out as the shape's error event, not as exceptions."""

    def feed(self, chunk: bytes) -> bytes: ...
    def finish(self) -> bytes: ...


def resource_url(channel: ChannelConfig, path: str) -> str:
    """Where a resource an upstream keeps (a stored or background response, a video) lives, `path`
    below its API's root: the channel's base URL in OpenAI's layout, Azure's own under /openai."""
    if channel.provider == "azure":
        return azure.resource_url(channel, path)
    return channel.base_url + path


def reasoning_apart(channel: ChannelConfig, model_type: str) -> bool:
    """Whether the upstream's usage counts a model's reasoning apart from its output (OpenAI's
    reasoning_tokens, Gemini's thoughtsTokenCount). Anthropic's Messages (on Vertex too) and
    Bedrock's Converse count thinking within the output tokens and show a summary of it, not all
    of it: there the gateway cannot know what of the output was thinking, and bills it as output,
    at the output price, whole or cut short (billing.stream_usage)."""
    return model_type != "messages" and channel.provider != "bedrock"


PROVIDERS: Final[Mapping[str, Provider]] = {
    "openai": openai,
    "anthropic": anthropic,
    "cohere": cohere,
    "azure": azure,
    "bedrock": bedrock,
    "gemini": gemini,
    "vertex": vertex,
}

__all__ = [
    "PROVIDERS",
    "Provider",
    "StreamTranslator",
    "anthropic",
    "azure",
    "bedrock",
    "cohere",
    "gemini",
    "openai",
    "reasoning_apart",
    "resource_url",
    "vertex",
]

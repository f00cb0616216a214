"""Anthropic's prompt caching, as the Messages API reports it.

A request marks cache breakpoints with `cache_control` on a tool, a system block or a message's
content block. The prompt up to the last breakpoint (tools, then system, then messages: Anthropic's
order) is the cached prefix: the first request with it writes it to the cache
(`cache_creation_input_tokens`), the next ones within five minutes read it
(`cache_read_input_tokens`, the five minutes starting again), and the rest of the prompt is
`input_tokens`. A breakpoint of `"ttl": "1h"` keeps it an hour, and its write is reported as one
(`cache_creation.ephemeral_1h_input_tokens`, billed at twice the input price). Unlike Anthropic,
any prefix is cached, however short (its minimum is 1,024 or more tokens), so that a test can see
both kinds with small prompts.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import orjson

from ..core import count_tokens

TTL_SECONDS = 300.0
HOUR_TTL_SECONDS = 3600.0


class PromptCache:
    def __init__(self) -> None:
        self._expiry: dict[bytes, float] = {}  # prefix digest -> when it leaves the cache

    def split(self, model: str, req: dict[str, Any], input_tokens: int) -> tuple[int, int, int, bool]:
        """The prompt's (fresh input, cache read, cache write) tokens, summing to `input_tokens`,
        and whether the write is kept an hour."""
        prefix = _cached_prefix(req)
        if not prefix:
            return input_tokens, 0, 0, False
        hour = _marker(prefix[-1]).get("ttl") == "1h"
        encoded = orjson.dumps(prefix)
        tokens = min(count_tokens(encoded.decode()), input_tokens)
        digest = hashlib.blake2b(model.encode() + b"\0" + encoded, digest_size=16).digest()
        now = time.monotonic()
        read = self._expiry.get(digest, 0.0) > now
        self._expiry[digest] = now + (HOUR_TTL_SECONDS if hour else TTL_SECONDS)
        if len(self._expiry) > 10_000:  # forget what has expired
            self._expiry = {k: v for k, v in self._expiry.items() if v > now}
        return input_tokens - tokens, tokens if read else 0, 0 if read else tokens, hour and not read


def _marker(part: Any) -> dict[str, Any]:
    marker = part.get("cache_control") if isinstance(part, dict) else None
    return marker if isinstance(marker, dict) else {}


def _cached_prefix(req: dict[str, Any]) -> list[Any]:
    """Everything of the prompt up to and including its last block marked `cache_control`."""
    parts: list[Any] = []
    last = 0
    for tool in req.get("tools") or []:
        parts.append(tool)
        if isinstance(tool, dict) and tool.get("cache_control"):
            last = len(parts)
    system = req.get("system")
    for block in system if isinstance(system, list) else [system] if system else []:
        parts.append(block)
        if isinstance(block, dict) and block.get("cache_control"):
            last = len(parts)
    for message in req.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        parts.append(message.get("role") if isinstance(message, dict) else None)
        for block in content if isinstance(content, list) else [content]:
            parts.append(block)
            if isinstance(block, dict) and block.get("cache_control"):
                last = len(parts)
    return parts[:last]

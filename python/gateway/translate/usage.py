"""Token usage in both text shapes, to and from the gateway's own `Usage`.

OpenAI's prompt_tokens includes cached tokens; Anthropic's input_tokens does not (cache reads and cache
writes are counted beside it). The mapping is the one the Rust core bills by (parse_messages_usage).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..pricing import Usage


def reported_count(value: Any) -> int | None:
    """A count as an upstream reports it: a whole number (0 included); None for anything else
    (absent, negative, a string, a boolean), where the caller may tell "not reported" apart."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def token_count(value: Any) -> int:
    """A token count as an upstream reports it: reported_count's, anything else none."""
    return reported_count(value) or 0


def usage_from_chat(usage: Mapping[str, Any]) -> Usage:
    """A chat completion's `usage` object."""
    prompt_details = usage.get("prompt_tokens_details")
    completion_details = usage.get("completion_tokens_details")
    prompt = prompt_details if isinstance(prompt_details, dict) else {}
    completion = completion_details if isinstance(completion_details, dict) else {}
    return Usage(
        prompt_tokens=token_count(usage.get("prompt_tokens")),
        completion_tokens=token_count(usage.get("completion_tokens")),
        cached_tokens=token_count(prompt.get("cached_tokens")),
        cache_write_tokens=token_count(prompt.get("cache_write_tokens")),
        reasoning_tokens=token_count(completion.get("reasoning_tokens")),
        audio_prompt_tokens=token_count(prompt.get("audio_tokens")),
        audio_completion_tokens=token_count(completion.get("audio_tokens")),
    )


def usage_from_messages(usage: Mapping[str, Any]) -> Usage:
    """A message's `usage` object: the prompt is fresh input plus cache reads and cache writes, of
    which those kept an hour (`cache_creation.ephemeral_1h_input_tokens`) are priced apart."""
    cache_read = token_count(usage.get("cache_read_input_tokens"))
    given = usage.get("cache_creation")
    by_ttl: Mapping[str, Any] = given if isinstance(given, dict) else {}
    hour = token_count(by_ttl.get("ephemeral_1h_input_tokens"))
    # The writes' total, else (an upstream that gives only the breakdown) the sum of its parts.
    total = reported_count(usage.get("cache_creation_input_tokens"))
    cache_write = total if total is not None else token_count(by_ttl.get("ephemeral_5m_input_tokens")) + hour
    return Usage(
        prompt_tokens=token_count(usage.get("input_tokens")) + cache_read + cache_write,
        completion_tokens=token_count(usage.get("output_tokens")),
        cached_tokens=cache_read,
        cache_write_tokens=cache_write,
        cache_write_1h_tokens=min(hour, cache_write),
    )


def chat_usage(usage: Usage) -> dict[str, Any]:
    """`usage` of a chat completion (and of the include_usage chunk of its stream); cache writes,
    which OpenAI's has no field for, as OpenRouter reports them, when there are any."""
    details: dict[str, int] = {"cached_tokens": usage.cached_tokens}
    if usage.cache_write_tokens:
        details["cache_write_tokens"] = usage.cache_write_tokens
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": details,
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
    }


def messages_usage(usage: Usage) -> dict[str, Any]:
    """`usage` of a message (and of message_delta in its stream)."""
    cached = min(usage.cached_tokens, usage.prompt_tokens)
    written = min(usage.cache_write_tokens, usage.prompt_tokens - cached)
    answer: dict[str, Any] = {
        "input_tokens": usage.prompt_tokens - cached - written,
        "output_tokens": usage.completion_tokens,
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": cached,
    }
    hour = min(usage.cache_write_1h_tokens, written)
    if hour:  # the writes by how long they are kept, as Anthropic reports them
        answer["cache_creation"] = {
            "ephemeral_5m_input_tokens": written - hour,
            "ephemeral_1h_input_tokens": hour,
        }
    return answer


def responses_usage(usage: Usage) -> dict[str, Any]:
    """`usage` of a Response (the Responses API counts as the chat shape does, under other names)."""
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.total_tokens,
    }

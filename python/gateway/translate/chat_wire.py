"""The chat completions wire format as writers of another format write it (providers.bedrock,
providers.gemini, chat_stream.py): the usage object, and the chunks of a stream."""

from __future__ import annotations

import time
from typing import Any

import orjson


def usage_object(
    prompt: int, completion: int, cached: int = 0, reasoning: int = 0, cache_write: int = 0
) -> dict[str, Any]:
    """OpenAI's usage object: the prompt includes its cached tokens (read and written), the
    completion its reasoning. Cache writes, for which OpenAI's has no field, go as OpenRouter
    reports them (prompt_tokens_details.cache_write_tokens), when there are any."""
    details = {"cached_tokens": cached}
    if cache_write:
        details["cache_write_tokens"] = cache_write
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": details,
        "completion_tokens_details": {"reasoning_tokens": reasoning},
    }


DONE = b"data: [DONE]\n\n"


class ChatChunks:
    """Chunks of one chat completion stream: with the gateway's `id` and `created` when a
    translator sets them itself, else the rewriter sets their id. `base["model"]` may be set later
    (an upstream that names its model in its first event)."""

    def __init__(self, model: str | None, id: str = "", created: int | None = None) -> None:
        self.base = {
            "id": id,
            "object": "chat.completion.chunk",
            "created": int(time.time()) if created is None else created,
            "model": model,
        }
        self._role_due = True  # the role goes with the first delta (`delta`)

    def delta(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        """One chunk; the first also says the role, as OpenAI's does: a chunk of its own with
        `content: ""` before text (or no output), `content: null` before reasoning, and beside the
        first tool call with `content: null` (review: a streamed answer of tool calls only ended
        with content "", where the same answer not streamed has null)."""
        if self._role_due:
            self._role_due = False
            if "tool_calls" in delta:
                delta = {"role": "assistant", "content": None, **delta}
            else:
                first = None if "reasoning_content" in delta else ""
                return self._chunk({"role": "assistant", "content": first}) + self._chunk(delta, finish)
        return self._chunk(delta, finish)

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return b"data: " + orjson.dumps({**self.base, "choices": [choice]}) + b"\n\n"

    def usage_and_done(self, usage: dict[str, Any] | None) -> bytes:
        """The usage chunk (no choices) and the stream's end."""
        return b"data: " + orjson.dumps({**self.base, "choices": [], "usage": usage}) + b"\n\n" + DONE

    @staticmethod
    def error(message: str, kind: str = "server_error", code: str | None = None) -> bytes:
        """The upstream's failure as an error chunk: the rewriter ends the stream on it. `code`
        keeps the provider's own kind of failure (its capacity, its content policy) for
        providers.base.stream_failure, when it ends the stream before its first token."""
        error = {"message": message, "type": kind, "param": None, "code": code}
        return b"data: " + orjson.dumps({"error": error}) + b"\n\n"

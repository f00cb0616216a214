"""The simulator's vocabulary: every generated text is drawn from these words, deterministically."""

from __future__ import annotations

import hashlib
from typing import Any

WORDS = (
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "seven",
    "bright",
    "stars",
    "watch",
    "from",
    "above",
    "and",
    "rivers",
    "run",
    "down",
    "toward",
    "the",
    "calm",
    "sea",
    "where",
    "ships",
    "sail",
    "past",
    "old",
    "harbor",
    "lights",
    "into",
    "the",
    "night",
)


def pick(seed: bytes, count: int, offset: int = 0) -> list[str]:
    """`count` words chosen by a hash of `seed`: the same seed, the same words."""
    start = int.from_bytes(hashlib.blake2b(seed, digest_size=4).digest()) + offset
    return [WORDS[(start + i * 7) % len(WORDS)] for i in range(count)]


def spaced(seed: bytes, count: int, offset: int = 0) -> list[str]:
    """Words as streamed tokens, each with its leading space."""
    return [" " + w for w in pick(seed, count, offset)]


def last_text(messages: list[Any]) -> str | None:
    """The text of the last chat message, whether its content is a string or a list of blocks."""
    last = messages[-1] if messages else None
    content = last.get("content") if isinstance(last, dict) else None
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            b.get("text", "") for b in content if isinstance(b, dict) and isinstance(b.get("text"), str)
        )
    return None


def within_limit(limit: object, reasoning: int, answer: int) -> tuple[int, int]:
    """How many words of reasoning and of answer a reply whose output limit is `limit` (a positive
    whole number; anything else is none) carries. Every API counts the reasoning inside the output
    limit: the reasoning comes first, the answer takes what it leaves (none, cut at the limit)."""
    if not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0:
        return reasoning, answer
    thought = min(reasoning, limit)
    return thought, min(answer, limit - thought)

"""Micro-benchmarks: each job of the Rust core beside the nearest way of doing it in Python.

The Python side uses the standard library (json, hashlib) or, for token counting, OpenAI's tiktoken,
which is what a Python gateway would use. Times are per operation, through the Python binding, so
they include the cost of crossing it.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from gateway.core import ChatStreamRewriter, TokenBucket, count_tokens, fingerprint


def per_op(fn: Callable[[], object], ops_per_call: int = 1) -> float:
    """Seconds per operation: the best of five timed rounds of about 0.2 s each."""
    timer = timeit.Timer(fn)
    number, _ = timer.autorange()
    return min(timer.repeat(repeat=5, number=number)) / number / ops_per_call


def _stream(chunks: int) -> bytes:
    base = {
        "id": "chatcmpl-upstream",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "system_fingerprint": "fp",
        "choices": [{"index": 0, "delta": {"content": " word"}, "finish_reason": None}],
    }
    return (
        b"".join(b"data: " + json.dumps(base).encode() + b"\n\n" for _ in range(chunks)) + b"data: [DONE]\n\n"
    )


def _python_rewrite(data: bytes, new_id: str) -> bytes:
    out = []
    for event in data.split(b"\n\n"):
        if not event:
            continue
        payload = event[len(b"data: ") :]
        if payload == b"[DONE]":
            out.append(b"data: [DONE]\n\n")
            continue
        chunk = json.loads(payload)
        chunk["id"] = new_id
        out.append(b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n")
    return b"".join(out)


class PythonBucket:
    """The usual pure-Python token bucket (floats, monotonic time)."""

    def __init__(self, capacity: float, rate: float) -> None:
        self.capacity, self.rate, self.tokens, self.last = capacity, rate, capacity, time.monotonic()

    def try_take(self, n: float) -> bool:
        now = time.monotonic()
        self.tokens = min(self.capacity, self.tokens + (now - self.last) * self.rate)
        self.last = now
        if self.tokens >= n:
            self.tokens -= n
            return True
        return False


def _fmt(seconds: float) -> str:
    if seconds < 1e-6:
        return f"{seconds * 1e9:.0f} ns"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    return f"{seconds * 1e3:.2f} ms"


def run() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []

    def add(job: str, rust: float, python: float | None) -> None:
        rows.append(
            {
                "job": job,
                "rust": _fmt(rust),
                "python": _fmt(python) if python else "–",
                "rust_s": rust,
                "python_s": python,
                "speedup": (python / rust) if python else 0.0,
            }
        )
        print(f"  {job:42} rust {_fmt(rust):>10}   python {_fmt(python) if python else '–':>10}", flush=True)

    stream = _stream(200)

    def rust_rewrite() -> None:
        rw = ChatStreamRewriter("chatcmpl-gw", True)
        rw.feed(stream)

    add(
        "SSE rewrite, per chunk (200-chunk stream)",
        per_op(rust_rewrite, 200),
        per_op(lambda: _python_rewrite(stream, "chatcmpl-gw"), 200),
    )

    text = ("The quick brown fox jumps over the lazy dog; 12345 ünïcödé 😀. " * 20)[:1024]
    import tiktoken_reference

    reference = tiktoken_reference.load(("o200k_base",))
    tiktoken_time = per_op(lambda: reference["o200k_base"].encode_ordinary(text)) if reference else None
    add(
        "token count o200k_base, per KB (Python: tiktoken)", per_op(lambda: count_tokens(text)), tiktoken_time
    )

    bucket = TokenBucket(10**12, 10**12, 60_000_000_000, time.monotonic_ns())
    py_bucket = PythonBucket(1e12, 1e12 / 60)
    add(
        "token bucket take",
        per_op(lambda: bucket.try_take(1, time.monotonic_ns())),
        per_op(lambda: py_bucket.try_take(1)),
    )

    doc = {"prompt": "x" * 200, "items": [{"k": i, "v": "y" * 40, "n": {"a": i}} for i in range(12_000)]}
    body = json.dumps(doc).encode()
    mb = len(body) / 1e6

    def python_fingerprint() -> str:
        canonical = json.dumps(json.loads(body), sort_keys=True, separators=(",", ":")).encode()
        return hashlib.blake2b(b"POST\0/v1/images/generations\0" + canonical).hexdigest()

    add(
        "fingerprint of a JSON body, per MB",
        per_op(lambda: fingerprint("POST", "/v1/images/generations", body, "application/json")) / mb,
        per_op(python_fingerprint) / mb,
    )
    return rows


if __name__ == "__main__":
    run()

"""HTTP/1.1 framing shared by the simulator's endpoint modules: whole answers, streamed heads and
chunks, and OpenAI's error body."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import orjson

Send = Callable[[bytes], None]

REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    413: "Payload Too Large",
    429: "Too Many Requests",
    500: "Internal Server Error",
    501: "Not Implemented",
    502: "Bad Gateway",
    503: "Service Unavailable",
    529: "Overloaded",
}
SSE_HEAD = [
    ("content-type", "text/event-stream; charset=utf-8"),
    ("cache-control", "no-cache"),
    ("transfer-encoding", "chunked"),
]
END_OF_CHUNKS = b"0\r\n\r\n"


@dataclass(frozen=True, slots=True)
class Answer:
    """A whole answer, for endpoint modules that compute it without I/O."""

    status: int
    body: bytes
    content_type: str = "application/json"


def head(status: int, headers: list[tuple[str, str]]) -> bytes:
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}"]
    lines.extend(f"{k}: {v}" for k, v in headers)
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def full(
    status: int,
    body: bytes,
    content_type: str = "application/json",
    extra: list[tuple[str, str]] | None = None,
) -> bytes:
    headers = [("content-type", content_type), ("content-length", str(len(body)))]
    if extra:
        headers.extend(extra)
    return head(status, headers) + body


def chunk(data: bytes) -> bytes:
    """One piece of a chunked (transfer-encoding) body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def openai_error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type_, "param": param, "code": code}})


def openai_error(
    status: int, message: str, type_: str, code: str | None = None, param: str | None = None
) -> bytes:
    extra = [("retry-after", "1")] if status == 429 else None
    return full(status, openai_error_body(message, type_, param, code), extra=extra)


def error_answer(
    message: str, param: str | None = None, *, status: int = 400, type_: str = "invalid_request_error"
) -> Answer:
    """An OpenAI-format error as an Answer."""
    return Answer(status, openai_error_body(message, type_, param))

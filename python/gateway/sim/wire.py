"""HTTP for the simulator's API modules, on aiohttp.web: whole answers, streamed answers and the
providers' error bodies.

API modules that compute an answer without I/O return an `Answer` (no aiohttp in them); handlers turn
it into a response with `respond`. Streaming handlers write through an `EventStream`, which also
carries out the directives that break a stream (drop the connection, send an error).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

Headers = Mapping[str, str]  # a request's headers, read case-insensitively

SSE = "text/event-stream; charset=utf-8"


@dataclass(frozen=True, slots=True)
class Answer:
    """A whole answer, for endpoint modules that compute it without I/O."""

    status: int
    body: bytes
    content_type: str = "application/json"


def reply(status: int, body: bytes, content_type: str = "application/json") -> web.Response:
    """A whole answer; a 429 says when to retry, as the providers' do."""
    headers = {"Content-Type": content_type}
    if status == 429:
        headers["Retry-After"] = "1"
    return web.Response(status=status, body=body, headers=headers)


def respond(answer: Answer) -> web.Response:
    return reply(answer.status, answer.body, answer.content_type)


def json_object(body: bytes) -> dict[str, Any] | None:
    """The request body as a JSON object, or None."""
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def openai_error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type_, "param": param, "code": code}})


def openai_error(
    status: int,
    message: str,
    type_: str = "invalid_request_error",
    code: str | None = None,
    param: str | None = None,
) -> web.Response:
    return reply(status, openai_error_body(message, type_, param, code))


def bad_json() -> web.Response:
    """OpenAI's answer to a body that is not a JSON object."""
    return openai_error(400, "We could not parse the JSON body of your request.")


def anthropic_error(status: int, message: str, kind: str = "invalid_request_error") -> web.Response:
    return reply(status, orjson.dumps({"type": "error", "error": {"type": kind, "message": message}}))


def error_answer(
    message: str, param: str | None = None, *, status: int = 400, type_: str = "invalid_request_error"
) -> Answer:
    """An OpenAI-format error as an Answer."""
    return Answer(status, openai_error_body(message, type_, param))


class EventStream:
    """A streamed answer (server-sent events by default, or any chunked body).

    A client that leaves mid-stream makes the remaining sends no-ops, as a real upstream's writes
    would go nowhere; `drop` cuts the connection without ending the body, which is what the
    `drop_after` directive asks for.
    """

    __slots__ = ("closed", "request", "response")

    def __init__(self, request: web.Request, content_type: str = SSE) -> None:
        self.request = request
        headers = {"Content-Type": content_type}
        if content_type == SSE:
            headers["Cache-Control"] = "no-cache"
        self.response = web.StreamResponse(status=200, headers=headers)
        self.response.enable_chunked_encoding()
        self.closed = False

    async def open(self) -> None:
        """Send the head."""
        await self.response.prepare(self.request)

    async def send(self, data: bytes) -> None:
        if self.closed:
            return
        try:
            await self.response.write(data)
        except ConnectionError:
            self.closed = True

    async def event(self, name: str, data: Any) -> None:
        """One named server-sent event (Anthropic's and the Responses API's framing)."""
        await self.send(b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n")

    async def data(self, data: Any) -> None:
        """One unnamed server-sent event (Chat Completions' framing)."""
        await self.send(b"data: " + orjson.dumps(data) + b"\n\n")

    def drop(self) -> None:
        """Cut the connection now, without the body's end."""
        transport = self.request.transport
        if transport is not None:
            transport.abort()
        self.closed = True

    async def end(self) -> web.StreamResponse:
        """End the body (unless the connection is gone) and give the response back to aiohttp."""
        if not self.closed:
            try:
                await self.response.write_eof()
            except ConnectionError:
                self.closed = True
        return self.response

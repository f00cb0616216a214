"""The last event of a stream that fails after it started (spec 6.1.7), in each text shape's own
event format, so that the shape's clients report it as an error instead of rejecting the chunk.

Each carries the spec's error object (2.1: message, type, param, code) as well, so a reader of
either kind finds what it looks for, and the stream's id at the top level, as every chunk before it
does (spec 6.1.6):

- chat completions: `data: {"error": {...}}`, as OpenAI ends a failed stream;
- messages: `event: error` with `{"type": "error", "error": {...}}`, Anthropic's event, `error.type`
  in Anthropic's vocabulary (errors.MESSAGES_ERROR_TYPES) and the spec's `code` beside it;
- responses: `event: error` with OpenAI's error event `{"type": "error", "code", "message",
  "param", "sequence_number"}` and the spec's object as `error`.
"""

from __future__ import annotations

from collections.abc import Callable

import orjson

from .errors import ErrorCode, error_object

# code, message, the number of events the client has received so far (the next event's sequence
# number in the Responses shape, whose numbers start at 0) and the stream's id -> the final
# event's bytes.
StreamErrorRenderer = Callable[[ErrorCode, str, int, str], bytes]


def chat_error_event(code: ErrorCode, message: str, events_sent: int, stream_id: str) -> bytes:
    return b"data: " + orjson.dumps({"id": stream_id, "error": error_object(code, message)}) + b"\n\n"


def messages_error_event(code: ErrorCode, message: str, events_sent: int, stream_id: str) -> bytes:
    event = {"type": "error", "id": stream_id, "error": error_object(code, message, shape="messages")}
    return b"event: error\ndata: " + orjson.dumps(event) + b"\n\n"


def responses_error_event(code: ErrorCode, message: str, events_sent: int, stream_id: str) -> bytes:
    event = {
        "type": "error",
        "id": stream_id,
        "code": code,
        "message": message,
        "param": None,
        "sequence_number": events_sent,
        "error": error_object(code, message),
    }
    return b"event: error\ndata: " + orjson.dumps(event) + b"\n\n"

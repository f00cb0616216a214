"""The Rust core, as Python imports it: the one module through which the gateway reaches `gateway._core`.

`gateway._core` is the compiled extension (crate `rust/py`, logic in `rust/core`, types in
`_core.pyi`); everything else imports from here, as pydantic imports pydantic-core. The core's
exceptions are defined here, under the gateway's own error type, and the extension raises these
classes.
"""

from __future__ import annotations

from ._core import (
    AUDIO_TOKENS_PER_SECOND,
    EMPTY_STREAM_ERROR,
    IMAGE_PART_TOKENS,
    MALFORMED_EVENT_ERROR,
    MAX_EVENT_BYTES,
    MIN_AUDIO_BYTES_PER_SECOND,
    OVERSIZED_EVENT_ERROR,
    AppendFile,
    ChatStreamRewriter,
    EventStreamMessage,
    EventStreamParser,
    MessagesStreamRewriter,
    MultipartPart,
    RequestTally,
    ResponsesStreamRewriter,
    RewrittenResponse,
    SharedBuckets,
    SseEvent,
    SseParser,
    StreamUsage,
    TakeResult,
    TokenBucket,
    __version__,
    answer_line,
    count_chat_tokens,
    count_prompt_tokens,
    count_tokens,
    file_len,
    fingerprint,
    forget_random,
    json_nesting_depth,
    key_digest,
    log_timestamp,
    new_id,
    parse_chat_usage,
    parse_messages_usage,
    parse_multipart,
    parse_response_head,
    request_trace,
    rewrite_response,
    set_json_id,
    stamp_answer,
    wav_seconds,
)
from .errors import GatewayError


class CoreError(GatewayError, ValueError):
    """Root of every exception the Rust core raises, except OSError from its files.

    Each is bad bytes or a bad argument: callers catch it where they know whose bytes they were
    (a client's body: invalid_request; an upstream's: provider_error). One that escapes them is the
    gateway's own failure, hence the code `api_error` (500).
    """

    def __init__(self, message: str) -> None:
        super().__init__("api_error", message)


class UnknownEncodingError(CoreError):
    """The tokenizer name is not one of the bundled vocabularies."""


class InvalidJsonError(CoreError):
    """Bytes that had to be JSON were not (the message says where)."""


class InvalidEventStreamError(CoreError):
    """Bytes that had to be an AWS event stream broke its framing (a CRC, a length, a header)."""


class InvalidHttpError(CoreError):
    """Bytes that had to be an HTTP/1.x answer head were not (an upstream's: providers/http.py)."""


__all__ = [
    "AUDIO_TOKENS_PER_SECOND",
    "EMPTY_STREAM_ERROR",
    "IMAGE_PART_TOKENS",
    "MALFORMED_EVENT_ERROR",
    "MAX_EVENT_BYTES",
    "MIN_AUDIO_BYTES_PER_SECOND",
    "OVERSIZED_EVENT_ERROR",
    "AppendFile",
    "ChatStreamRewriter",
    "CoreError",
    "EventStreamMessage",
    "EventStreamParser",
    "InvalidEventStreamError",
    "InvalidHttpError",
    "InvalidJsonError",
    "MessagesStreamRewriter",
    "MultipartPart",
    "RequestTally",
    "ResponsesStreamRewriter",
    "RewrittenResponse",
    "SharedBuckets",
    "SseEvent",
    "SseParser",
    "StreamUsage",
    "TakeResult",
    "TokenBucket",
    "UnknownEncodingError",
    "__version__",
    "answer_line",
    "count_chat_tokens",
    "count_prompt_tokens",
    "count_tokens",
    "file_len",
    "fingerprint",
    "forget_random",
    "json_nesting_depth",
    "key_digest",
    "log_timestamp",
    "new_id",
    "parse_chat_usage",
    "parse_messages_usage",
    "parse_multipart",
    "parse_response_head",
    "request_trace",
    "rewrite_response",
    "set_json_id",
    "stamp_answer",
    "wav_seconds",
]

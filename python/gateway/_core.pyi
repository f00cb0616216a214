"""Typed face of the Rust extension `gateway._core` (crate `rust/py`, logic in `rust/core`).

Import it through `gateway.core`, never directly. Every function here is pure or owns its own
small state; only SharedBuckets, AppendFile and file_len do I/O (files). Errors raised by the
extension are the classes of `gateway.core` (CoreError and its subclasses, under the gateway's
GatewayError), except OSError from those files.
"""

import os
from collections.abc import Iterable
from typing import Final, Literal, Self, TypeAlias, final

__version__: Final[str]
MAX_EVENT_BYTES: Final[int]
"""The largest SSE event or line a parser holds (16 MiB); past it the stream is treated as broken."""
OVERSIZED_EVENT_ERROR: Final[bytes]
"""The upstream error a rewriter reports (in `error`) when an event passed MAX_EVENT_BYTES."""
MALFORMED_EVENT_ERROR: Final[bytes]
"""The upstream error a rewriter reports (in `error`) when an event's data is not a JSON object."""
EMPTY_STREAM_ERROR: Final[bytes]
"""The upstream error a chat rewriter reports (in `error`) when `[DONE]` came before any chunk."""
IMAGE_PART_TOKENS: Final[int]
"""The prompt tokens count_chat_tokens holds an image part at unless told otherwise (1,600)."""
AUDIO_TOKENS_PER_SECOND: Final[int]
"""Input audio's tokens a second as OpenAI bills them (10: a token per 100 ms)."""
MIN_AUDIO_BYTES_PER_SECOND: Final[int]
"""The lowest bitrate compressed audio plausibly has (8 kbit/s, 1,000 bytes a second): its size
then bounds its length."""
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
    "EventStreamMessage",
    "EventStreamParser",
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

_Encoding: TypeAlias = Literal["o200k_base", "cl100k_base"]

# ---------------------------------------------------------------- SSE

@final
class SseEvent:
    """One whole server-sent event. `data` joins multiple data: lines with "\\n"."""

    @property
    def event(self) -> str | None:
        """The event: field; None when absent or empty (a plain "message" event)."""
    @property
    def data(self) -> str: ...
    @property
    def id(self) -> str | None:
        """This event's own id: field (not carried over from earlier events as EventSource does)."""
    @property
    def retry(self) -> int | None: ...

@final
class SseParser:
    """Incremental SSE parser (WHATWG rules): feed byte chunks split anywhere, get whole events.

    LF, CRLF and CR line ends; comment lines (":...") ignored; a UTF-8 BOM at the very start skipped;
    an event is dispatched at a blank line; an event with no data: line is not dispatched.
    """

    def __new__(cls) -> Self: ...
    def feed(self, chunk: bytes) -> list[SseEvent]: ...
    def finish(self) -> list[SseEvent]:
        """End of input: dispatch a last event that lacked its blank line."""
    @property
    def overflowed(self) -> bool:
        """An event or line grew past MAX_EVENT_BYTES: the parser holds nothing and yields nothing
        more."""

# ---------------------------------------------------------------- AWS event streams

@final
class EventStreamMessage:
    """One message of an `application/vnd.amazon.eventstream` stream (Bedrock's ConverseStream)."""

    @property
    def headers(self) -> dict[str, str | bytes | int | bool]:
        """Every header: strings as str, bytes and UUIDs as bytes, integers and timestamps
        (milliseconds) as int, booleans as bool."""
    def header(self, name: str) -> str | None:
        """A string header's value (":message-type", ":event-type", ":exception-type" ...)."""
    @property
    def payload(self) -> bytes: ...

@final
class EventStreamParser:
    """Incremental parser of AWS's binary event stream: feed chunks split anywhere, get whole
    messages. Prelude and message CRC-32s are checked; a message that breaks the framing raises
    InvalidEventStreamError, and the parser then stays failed (the rest cannot be trusted)."""

    def __new__(cls) -> Self: ...
    def feed(self, chunk: bytes) -> list[EventStreamMessage]: ...
    def finish(self) -> None:
        """End of input: raises InvalidEventStreamError when it came inside a message."""

# ---------------------------------------------------------------- chat streams

@final
class ChatStreamRewriter:
    """Rewrites an upstream OpenAI chat-completions SSE stream for the client.

    Every JSON chunk gets its top-level "id" set to `response_id` (inserted when absent); the rest of the
    chunk's bytes are untouched. Output is normalised to `data: <json>\\n\\n` per event.
    Reads `usage` when present, collects streamed output text (delta content, reasoning content, tool-call
    arguments) so output can be counted when the upstream gives no usage, and notes `[DONE]`.
    When `forward_usage` is False, a chunk whose `choices` is empty and which carries a non-null usage
    (the include_usage chunk the gateway asked for on its own) is consumed, not forwarded.
    An upstream chunk with a top-level "error" member is not forwarded: its raw JSON lands in `error`;
    an event past MAX_EVENT_BYTES ends the stream the same way, with OVERSIZED_EVENT_ERROR.
    Data that is not a JSON object (white space aside) ends the stream the same way, with
    MALFORMED_EVENT_ERROR. Fields of an unexpected type are ignored
    rather than fatal, and a valid JSON object of an unexpected shape still gets the id.
    """

    def __new__(cls, response_id: str, forward_usage: bool) -> Self: ...
    def feed(self, chunk: bytes) -> bytes:
        """Bytes to send to the client for all events completed by this chunk (may be b"")."""
    def finish(self) -> bytes:
        """End of upstream input; flushes a last event that lacked its blank line."""
    @property
    def done(self) -> bool:
        """`data: [DONE]` was seen (and forwarded, unless `awaits_usage`)."""
    @property
    def awaits_usage(self) -> bool:
        """The stream is done but its `[DONE]` was held back: `forward_usage` (the client asked for
        usage) and the upstream sent none. The caller ends the stream with the gateway's own usage
        chunk, then `data: [DONE]`."""
    @property
    def chunks(self) -> int:
        """JSON chunks forwarded so far."""
    @property
    def saw_output(self) -> bool:
        """Any non-empty output (content, reasoning or tool-call text) was forwarded."""
    @property
    def spoken(self) -> bool:
        """The answer is spoken (`delta.audio`): its output text is the transcript of audio."""
    @property
    def output_text(self) -> str:
        """All streamed output text so far, concatenated."""
    @property
    def output_len(self) -> int:
        """A mark of the output collected so far (cheap; for `output_upto`)."""
    def output_upto(self, mark: int) -> str:
        """The output text collected up to a mark taken from `output_len`."""
    def reasoning_upto(self, mark: int) -> str:
        """The reasoning (reasoning_content, reasoning) within the output up to such a mark."""
    @property
    def usage(self) -> StreamUsage | None:
        """The last non-null usage object seen, if any."""
    @property
    def model(self) -> str | None:
        """The upstream's "model" field from the first chunk that had one."""
    @property
    def finish_reason(self) -> str | None: ...
    @property
    def error(self) -> bytes | None:
        """Raw JSON of an upstream error chunk, if one arrived (then the stream is over)."""

@final
class MessagesStreamRewriter:
    """Rewrites an upstream message-style (Anthropic Messages API) SSE stream for the client.

    Event names are kept; every event's JSON gets a top-level "id" set to `response_id`, and
    message_start also gets it as message.id; nothing else changes. Usage is read from message_start
    (input, cache reads counted as cached prompt tokens) and message_delta (cumulative output); text,
    thinking and tool-input JSON are collected in `output_text`. message_stop sets `done` and is
    followed by `data: [DONE]` (the client library ignores unnamed events). An upstream error event is
    not forwarded: its raw JSON lands in `error`.
    """

    def __new__(cls, response_id: str) -> Self: ...
    def feed(self, chunk: bytes) -> bytes: ...
    def finish(self) -> bytes: ...
    @property
    def done(self) -> bool: ...
    @property
    def chunks(self) -> int: ...
    @property
    def saw_output(self) -> bool: ...
    @property
    def spoken(self) -> bool: ...
    @property
    def output_text(self) -> str: ...
    @property
    def output_len(self) -> int: ...
    def output_upto(self, mark: int) -> str: ...
    def reasoning_upto(self, mark: int) -> str: ...
    @property
    def usage(self) -> StreamUsage | None: ...
    @property
    def model(self) -> str | None: ...
    @property
    def finish_reason(self) -> str | None: ...
    @property
    def error(self) -> bytes | None: ...

@final
class ResponsesStreamRewriter:
    """Rewrites an upstream OpenAI Responses API SSE stream for the client.

    Every event's JSON gets a top-level "id" set to `response_id`; the `response` object of lifecycle
    events (response.created ... response.completed) gets it as response.id, and its
    previous_response_id, when set, becomes `previous_response_id` (the gateway id the client sent).
    Event names are kept; nothing else changes. Usage is read from response.usage; text of every
    `*.delta` event except audio is collected in `output_text`. response.completed and
    response.incomplete set `done` and are followed by `data: [DONE]`. An `error` or response.failed
    event is not forwarded: its raw JSON lands in `error`.
    """

    def __new__(cls, response_id: str, previous_response_id: str | None = None) -> Self: ...
    def feed(self, chunk: bytes) -> bytes: ...
    def finish(self) -> bytes: ...
    @property
    def done(self) -> bool: ...
    @property
    def chunks(self) -> int: ...
    @property
    def saw_output(self) -> bool: ...
    @property
    def spoken(self) -> bool: ...
    @property
    def output_text(self) -> str: ...
    @property
    def output_len(self) -> int: ...
    def output_upto(self, mark: int) -> str: ...
    def reasoning_upto(self, mark: int) -> str: ...
    @property
    def usage(self) -> StreamUsage | None: ...
    @property
    def upstream_id(self) -> str | None:
        """The upstream's own id of this response (from the first response object seen)."""
    @property
    def item_ids(self) -> list[str]:
        """The ids of the response's output items so far (response.output_item.added / .done), in
        order: what a later turn's item_reference may name."""
    @property
    def model(self) -> str | None: ...
    @property
    def finish_reason(self) -> str | None:
        """The response's last status (in_progress, completed, incomplete)."""
    @property
    def error(self) -> bytes | None: ...

@final
class RewrittenResponse:
    @property
    def body(self) -> bytes: ...
    @property
    def upstream_id(self) -> str | None: ...
    @property
    def usage(self) -> StreamUsage | None:
        """usage mapped as OpenAI chat usage: input -> prompt, output -> completion, cached and
        reasoning from the details."""

def rewrite_response(body: bytes, new_id: str, previous_response_id: str | None = None) -> RewrittenResponse:
    """A whole Responses API object with its id set to `new_id` (and a set previous_response_id set
    to `previous_response_id`), with the upstream's id and usage. Raises InvalidJsonError unless the
    body is a valid JSON object."""

def parse_messages_usage(body: bytes) -> StreamUsage | None:
    """`usage` of a whole message (Anthropic Messages API), mapped as in streams; None when absent.

    Raises InvalidJsonError when the body is not a JSON object.
    """

@final
class StreamUsage:
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def completion_tokens(self) -> int: ...
    @property
    def total_tokens(self) -> int: ...
    @property
    def cached_tokens(self) -> int:
        """usage.prompt_tokens_details.cached_tokens, 0 when absent."""
    @property
    def cache_write_tokens(self) -> int:
        """Prompt tokens written to the provider's cache: a message's cache_creation_input_tokens,
        a chat usage's prompt_tokens_details.cache_write_tokens (the gateway's Bedrock
        translation); 0 when absent."""
    @property
    def reasoning_tokens(self) -> int:
        """usage.completion_tokens_details.reasoning_tokens, 0 when absent."""
    @property
    def counts(self) -> tuple[int, int, int, int, int, int, int, int, int]:
        """Every count at once, in the order of gateway.pricing.Usage's first nine fields: prompt,
        completion, cached, reasoning, cache-write, audio prompt, image prompt (0), the hour's
        cache-write and audio completion tokens."""
    @property
    def audio_prompt_tokens(self) -> int:
        """Of prompt_tokens, the audio's: usage.prompt_tokens_details.audio_tokens, 0 when absent."""
    @property
    def audio_completion_tokens(self) -> int:
        """Of completion_tokens, the audio's: usage.completion_tokens_details.audio_tokens, 0 when
        absent."""
    @property
    def cache_write_1h_tokens(self) -> int:
        """Of cache_write_tokens, those kept an hour: a message's
        usage.cache_creation.ephemeral_1h_input_tokens (never more than the writes), 0 when absent."""

def parse_chat_usage(body: bytes) -> StreamUsage | None:
    """`usage` of a whole (non-streamed) chat completion body; None when absent or null.

    Raises InvalidJsonError when the body is not a JSON object.
    """

def parse_response_head(buf: bytes) -> tuple[bool, int, list[tuple[str, str]], int] | None:
    """The HTTP/1.x answer head at the start of `buf` (an upstream's): whether it is HTTP/1.1, its
    status, each header line as (name, value) in order (values without surrounding blanks, read
    as Latin-1) and the head's length, its closing blank line included; None while incomplete.

    Raises InvalidHttpError when the bytes are not an answer head (a status line that is not
    HTTP/1.x, a malformed header line, control bytes in a value, more than 256 header lines).
    """

def json_nesting_depth(body: bytes, limit: int) -> int:
    """How deeply the JSON text `body` nests arrays and objects (0 for a scalar), counted to
    `limit + 1` at most (a scan of its brackets outside strings; it does not validate)."""

def set_json_id(body: bytes, new_id: str) -> bytes:
    """Return the JSON object `body` with its top-level "id" set to `new_id` (inserted when absent),
    all other bytes untouched. Raises InvalidJsonError when the body is not a JSON object (the whole
    body is validated)."""

def stamp_answer(
    body: bytes, new_id: str, shape: Literal["chat", "messages"]
) -> tuple[bytes, StreamUsage | None]:
    """`set_json_id(body, new_id)` and the answer's usage in its `shape` (as `parse_chat_usage` or
    `parse_messages_usage` reads it), from one reading of the body. Raises InvalidJsonError when
    either would, ValueError for an unknown shape."""

# ---------------------------------------------------------------- tokens

def count_tokens(text: str, encoding: _Encoding = "o200k_base") -> int:
    """Exact BPE token count (same as OpenAI's tiktoken), but for a piece the pre-tokenizer leaves
    whole that is longer than 1 MiB (a run of one character), counted a token a byte, its most, at
    once rather than merged for seconds. Releases the GIL for long texts."""

def count_chat_tokens(body: bytes, encoding: _Encoding = "o200k_base", image_tokens: int = 1600) -> int:
    """Prompt tokens of a chat-completions request body (the JSON object with "messages").

    OpenAI's accounting: 3 per message, +1 when it has a name, the tokens of every string field of the
    message (role, content text or text parts, name, tool-call names and arguments), +3 priming the reply.
    Then what else a provider bills as input: `tools`, `functions` and `response_format` as JSON; the
    message shape's tool_use input and tool_result content; `image_tokens` per image part; audio parts
    by their length (10 a second); file parts (chat `file`, responses `input_file`, messages
    `document`) by their pages if PDF (3,000 + `image_tokens` a page; 100 pages when unseen), else
    their text. Raises InvalidJsonError on a body that is not a JSON object with a "messages" array.
    """

def wav_seconds(data: bytes) -> float | None:
    """The length of a RIFF/WAVE file from its header; None for anything else (other formats would
    need decoding). The audio runs to the end of the file, whatever its `data` chunk says (a
    decoder reads a size of 0 so); a PCM header's rate is the slower of the two it gives (its byte
    rate, and sample rate times frame size), any other coding's MIN_AUDIO_BYTES_PER_SECOND. The
    prompt count holds an `input_audio` part by the same reading."""

def count_prompt_tokens(
    body: bytes, encoding: _Encoding = "o200k_base", image_tokens: int = 1600, spoken_tokens: int = 0
) -> tuple[int, int]:
    """count_chat_tokens's count and, of it, the audio's tokens: (tokens, audio_tokens). An earlier
    spoken answer named by id (an assistant message's `"audio": {"id": ...}`, billed again as audio
    input) counts `spoken_tokens`, as audio."""

# ---------------------------------------------------------------- rate limiting

@final
class TakeResult:
    @property
    def allowed(self) -> bool: ...
    @property
    def remaining(self) -> int:
        """Whole tokens left after this call (0 when in debt)."""
    @property
    def retry_after_ns(self) -> int:
        """0 when allowed; else nanoseconds until `n` tokens would be available. When `n` exceeds
        the capacity it can never be taken: this is then the time until the bucket is full (0 if it
        is full already)."""

@final
class TokenBucket:
    """Token bucket with exact integer arithmetic.

    Refills `refill_tokens` every `refill_period_ns` continuously (a per-minute limit L is
    `TokenBucket(L, L, 60_000_000_000, now)`), holding at most `capacity`. Starts full.
    Invariant: tokens admitted over any interval of length t (net of tokens given back through
    `adjust`) never exceed capacity + rate * t.
    Time is an integer in nanoseconds from any monotonic origin; time going backwards is treated as
    no time passing.
    """

    def __new__(cls, capacity: int, refill_tokens: int, refill_period_ns: int, now_ns: int) -> Self: ...
    def try_take(self, n: int, now_ns: int) -> TakeResult: ...
    def adjust(self, delta: int, now_ns: int) -> None:
        """Correct a reservation: positive returns tokens (capped at capacity), negative takes more
        (the bucket may go into debt, delaying later takes)."""
    def available(self, now_ns: int) -> int: ...
    @property
    def capacity(self) -> int: ...
    @property
    def state(self) -> tuple[int, int]:
        """(level, last_ns): the whole state, to store elsewhere (level is in token * period_ns units)."""
    @staticmethod
    def from_state(
        capacity: int, refill_tokens: int, refill_period_ns: int, level: int, last_ns: int
    ) -> TokenBucket:
        """Raises CoreError when `level` is above capacity * refill_period_ns or below the deepest
        debt a bucket can hold (-2**125); as in `TokenBucket(...)`, when refill_tokens or
        refill_period_ns is 0 or capacity * refill_period_ns is 2**125 or more."""

@final
class SharedBuckets:
    """Token buckets shared by every process that opens the same file: a table of `slots` slots
    (an existing file keeps its own size), each operation under the file's exclusive lock, which
    the kernel releases when a process dies. A bucket is named by `key` and behaves as
    `TokenBucket(capacity, refill_tokens, refill_period_ns, ...)`, starting full; a level above a
    lowered capacity is cut to it. Raises OSError when the file cannot be used, CoreError when it
    is not a table, has fewer than 32 slots, or a limit is invalid (as for TokenBucket)."""

    def __new__(cls, path: str | os.PathLike[str], slots: int) -> Self: ...
    def try_take(
        self, key: str, capacity: int, refill_tokens: int, refill_period_ns: int, n: int, now_ns: int
    ) -> TakeResult: ...
    def adjust(
        self, key: str, capacity: int, refill_tokens: int, refill_period_ns: int, delta: int, now_ns: int
    ) -> int:
        """Correct a reservation (as TokenBucket.adjust); returns the whole tokens left."""
    def available(
        self, key: str, capacity: int, refill_tokens: int, refill_period_ns: int, now_ns: int
    ) -> int: ...

# ---------------------------------------------------------------- small files, GIL held

@final
class AppendFile:
    """A file this process appends to (the settlement journal), created with mode 0600 and held
    under its exclusive lock (flock) until closed, so that others can tell its owner is alive.
    Unlike os.write, every call keeps the GIL: each is one short system call into the page cache,
    and giving the GIL up for it lets another thread take the interpreter while the event loop
    waits. OSError when the file cannot be opened, is locked by another holder, or a write fails."""

    def __new__(cls, path: str | os.PathLike[str]) -> Self: ...
    def append(self, data: bytes) -> None:
        """Append `data` whole (continued after a short write), or OSError with the file left as
        it was (a full disk: what was written of `data` is cut off again)."""
    def truncate(self) -> None:
        """Empty the file."""
    def close(self) -> None:
        """Close it and release the lock; again: nothing. Other calls then raise OSError."""

def file_len(path: str | os.PathLike[str]) -> int:
    """The length of the file at `path`, keeping the GIL (as AppendFile); OSError when missing."""

# ---------------------------------------------------------------- ids

def new_id(prefix: str) -> str:
    """`prefix`, the time in milliseconds as 12 hex digits, then 80 random bits as 20 (gateway.ids).
    OSError when the system's random source fails."""

def forget_random() -> None:
    """Forget the random bytes read ahead (a forked child must not hand out its parent's)."""

def request_trace(
    headers: Iterable[tuple[bytes, bytes]],
) -> tuple[str, str, str | None, str]:
    """(trace id, flags, parent span id or None, span id) of a request with these headers: its first
    traceparent's trace when valid (W3C: version ff and all-zero ids are not), else a new one,
    flagged sampled. The span id is always new. Ids are lowercase hex."""

# ---------------------------------------------------------------- keys

def key_digest(key: str) -> bytes:
    """SHA-256 of the key's text (UTF-8): what API keys are stored and looked up by (32 bytes)."""

# ---------------------------------------------------------------- idempotency

def fingerprint(
    method: str, path: str, body: bytes, content_type: str | None = None, key: bytes | None = None
) -> str:
    """Stable hex digest (BLAKE3, keyed when `key` — 32 bytes — is given) of method, path and body.

    JSON bodies (content type containing "json", or unknown type and the body parses) are canonicalised:
    object keys sorted, insignificant whitespace dropped. multipart/form-data bodies are reduced to their
    parts (name, filename, content type, bytes), sorted by name (repeated names keep their order), so
    neither the random boundary nor the fields' order matters. Other bodies
    are taken byte for byte. Releases the GIL for large bodies.
    """

# ---------------------------------------------------------------- multipart

@final
class MultipartPart:
    @property
    def name(self) -> str: ...
    @property
    def filename(self) -> str | None: ...
    @property
    def content_type(self) -> str | None: ...
    @property
    def data(self) -> bytes: ...

def parse_multipart(body: bytes, content_type: str) -> list[MultipartPart] | None:
    """The parts of a multipart/form-data body, in order; None when the body or the content type's
    boundary is malformed. Releases the GIL for large bodies."""

# ---------------------------------------------------------------- telemetry

_LineFormat: TypeAlias = Literal["json", "text"]

@final
class RequestTally:
    """A process's request metrics between two drains: each counter's amount by its labels, each
    histogram's observations by endpoint (a count per bucket, as prometheus_client's observe()
    would count them, and their sum). Models not in `models` count as "", and so do channels not
    configured for their model. Bounds are each histogram's upper bounds, ascending, +Inf excluded.
    CoreError when a line format is not "json" or "text"."""

    def __new__(
        cls,
        added_bounds: list[float],
        upstream_bounds: list[float],
        first_byte_bounds: list[float],
        models: list[tuple[str, list[str]]],
    ) -> Self: ...
    def request(self, endpoint: str, model: str | None, status: int, code: str | None) -> None:
        """One answered request (gateway_requests_total)."""
    def model_request(
        self,
        endpoint: str,
        model: str | None,
        status: int,
        code: str | None,
        total_ns: int,
        upstream_ns: int,
        first_byte_ns: int,
        attempts: list[tuple[str, str]],
        prompt_tokens: int,
        completion_tokens: int,
        cost: str | None,
        line: _LineFormat | None,
        now_ns: int,
        request_id: str,
        trace_id: str | None,
        account_id: str,
        key_id: str,
        method: str,
    ) -> bytes | None:
        """A model request has ended: its count, its latencies (added: up to a stream's first byte,
        else the whole request, less the upstream's; upstream_ns and first_byte_ns 0 when there was
        none), each (channel, outcome) tried (a failover when two channels differ), and when
        charged (`cost` in plain decimal notation) its tokens and cost. Returns its request line
        (newline included) in the `line` format, None without one."""
    def drain(
        self,
    ) -> tuple[list[tuple[str, list[str], float]], list[tuple[str, str, list[int], float]]]:
        """Everything gathered since the last drain, which starts afresh: (counter, labels, amount)
        for "requests", "tokens", "cost", "attempts" and "failovers"; (histogram, endpoint, counts
        per bucket with +Inf's last, sum) for "added_latency", "upstream_latency" and "first_byte"."""

def answer_line(
    line: _LineFormat,
    now_ns: int,
    trace_id: str | None,
    method: str,
    endpoint: str,
    status: int,
    code: str | None,
    duration_ns: int,
) -> bytes:
    """The request line of an answer that is not a model request's (newline included)."""

def log_timestamp(now_ns: int) -> str:
    """A request line's time: UTC to the millisecond, as datetime.isoformat(timespec="milliseconds")
    writes it ("2026-11-24T12:00:00.123+00:00")."""

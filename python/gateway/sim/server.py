"""The upstream simulator: a real HTTP/1.1 server on loopback speaking OpenAI's wire format.

Written on asyncio's Protocol API rather than a framework so that it is never the bottleneck when the
gateway is measured against it. It answers deterministically (the same request, the same text) and
keeps the last requests it received so tests can see exactly which parameters arrived.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import hashlib
import math
import re
import struct
import time
from collections.abc import Callable
from typing import Any, cast

import orjson

from ..core import count_chat_tokens, count_tokens
from . import directives, images, moderation, structured, tools, transcription, videos
from .directives import DirectiveError, Directives
from .responses import JOB_ROUTE, ResponsesSim
from .tools import ToolCall
from .wire import END_OF_CHUNKS, SSE_HEAD, chunk, full, head, openai_error
from .words import WORDS

_MAX_HEAD = 64 * 1024


_AUDIO_TYPES = {"mp3": "audio/mpeg", "wav": "audio/wav", "pcm": "audio/pcm"}
_RATE = 24_000  # samples per second, 16-bit mono, as the API's pcm format
# An MPEG-1 Layer III frame header (128 kbit/s, 44.1 kHz, mono); all-zero side info and data is silence.
_MP3_FRAME = b"\xff\xfb\x90\xc0" + bytes(413)


def _audio(fmt: str, seconds: float) -> bytes:
    if fmt == "mp3":
        return _MP3_FRAME * max(1, round(seconds * 44_100 / 1152))
    n = int(seconds * _RATE)
    pcm = b"".join(struct.pack("<h", int(8000 * math.sin(2 * math.pi * 440 * i / _RATE))) for i in range(n))
    if fmt == "pcm":
        return pcm
    header = (
        b"RIFF"
        + struct.pack("<I", 36 + len(pcm))
        + b"WAVE"
        + b"fmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, _RATE, _RATE * 2, 2, 16)
        + b"data"
        + struct.pack("<I", len(pcm))
    )
    return header + pcm


def _anthropic_error(status: int, message: str, kind: str) -> bytes:
    body = orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})
    extra = [("retry-after", "1")] if status == 429 else None
    return full(status, body, extra=extra)


def _last_text(messages: list[Any]) -> str | None:
    """The text of the last message, whether its content is a string or a list of blocks."""
    last = messages[-1] if messages else None
    content = last.get("content") if isinstance(last, dict) else None
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            b.get("text", "") for b in content if isinstance(b, dict) and isinstance(b.get("text"), str)
        )
    return None


def _json_object(body: bytes, send: Callable[[bytes], None]) -> dict[str, Any] | None:
    """The request body as a JSON object, or None after answering 400 as OpenAI does."""
    try:
        req = orjson.loads(body)
    except orjson.JSONDecodeError:
        req = None
    if not isinstance(req, dict):
        send(
            openai_error(
                400, "We could not parse the JSON body of your request.", "invalid_request_error", None
            )
        )
        return None
    return req


def _vector(seed: bytes, dims: int) -> list[float]:
    """A deterministic unit vector for a text (float32-exact, so base64 and floats agree)."""
    digest = hashlib.shake_256(seed).digest(dims * 2)
    raw = [int.from_bytes(digest[i : i + 2]) / 65535 - 0.5 for i in range(0, dims * 2, 2)]
    norm = sum(v * v for v in raw) ** 0.5 or 1.0
    return [struct.unpack("<f", struct.pack("<f", v / norm))[0] for v in raw]


def _text(seed: bytes, count: int, offset: int = 0) -> list[str]:
    start = int.from_bytes(hashlib.blake2b(seed, digest_size=4).digest()) + offset
    return [" " + WORDS[(start + i * 7) % len(WORDS)] for i in range(count)]


class Simulator:
    def __init__(self, history: int = 1000) -> None:
        self.requests: collections.deque[dict[str, Any]] = collections.deque(maxlen=history)
        self.responses = ResponsesSim()
        self.videos = videos.VideoJobs()

    # Each handler writes its answer through `send`; streaming handlers are coroutines.
    async def handle(
        self,
        method: str,
        path: str,
        headers: dict[str, str],
        body: bytes,
        send: Callable[[bytes], None],
        abort: Callable[[], None],
    ) -> None:
        path, _, query = path.partition("?")
        if path.startswith("/_sim/"):
            send(self._control(method, path))
        elif path.endswith("/chat/completions"):
            if method != "POST":
                send(openai_error(405, "Use POST.", "invalid_request_error", None))
                return
            await self._chat(headers, body, send, abort)
        elif path.endswith("/audio/speech"):
            if method != "POST":
                send(openai_error(405, "Use POST.", "invalid_request_error", None))
                return
            await self._speech(headers, body, send)
        elif path.endswith("/audio/transcriptions") and method == "POST":
            self._transcription(headers, body, send)
        elif path.endswith(("/images/generations", "/images/edits")):
            answer, record = images.create(method, path, headers, body)
            if record is not None:
                self.requests.append(record)
            send(full(answer.status, answer.body, answer.content_type))
        elif videos.ROUTE.match(path):
            answer, record = await self.videos.handle(method, path, query, headers, body)
            if record is not None:
                self.requests.append(record)
            extra = [("retry-after", "1")] if answer.status == 429 else None
            send(full(answer.status, answer.body, answer.content_type, extra))
        elif path.endswith("/rerank"):
            if method != "POST":
                send(openai_error(405, "Use POST.", "invalid_request_error", None))
                return
            self._rerank(body, send)
        elif path.endswith("/v1/messages"):
            if method != "POST":
                send(_anthropic_error(405, "Use POST.", "invalid_request_error"))
                return
            await self._messages(headers, body, send, abort)
        elif path.endswith("/responses") and method == "POST":
            await self.responses.handle(headers, body, self.requests.append, send, abort)
        elif JOB_ROUTE.match(path):
            answer, record = self.responses.job(method, path)
            self.requests.append(record)
            send(full(answer.status, answer.body, answer.content_type))
        elif path.endswith("/moderations") and method == "POST":
            status, moderated, record = moderation.moderate(headers, body)
            if record is not None:
                self.requests.append(record)
            send(full(status, moderated))
        elif path.endswith("/embeddings"):
            if method != "POST":
                send(openai_error(405, "Use POST.", "invalid_request_error", None))
                return
            self._embeddings(body, send)
        elif path.endswith("/models") and method == "GET":
            send(
                full(
                    200,
                    orjson.dumps(
                        {
                            "object": "list",
                            "data": [{"id": "sim", "object": "model", "created": 0, "owned_by": "sim"}],
                        }
                    ),
                )
            )
        else:
            send(openai_error(404, f"Unknown path {path}", "invalid_request_error", "unknown_url"))

    def _control(self, method: str, path: str) -> bytes:
        if path == "/_sim/requests" and method == "GET":
            return full(200, orjson.dumps(list(self.requests)))
        if path == "/_sim/requests" and method == "DELETE":
            self.requests.clear()
            return full(200, b"{}")
        if path == "/_sim/health":
            return full(200, b'{"ok":true}')
        if path.startswith(images.FILES_PATH) and method == "GET":
            answer = images.file(path)
            return full(answer.status, answer.body, answer.content_type)
        return openai_error(404, f"Unknown path {path}", "invalid_request_error", "unknown_url")

    def _embeddings(self, body: bytes, send: Callable[[bytes], None]) -> None:
        req = _json_object(body, send)
        if req is None:
            return
        raw = req.get("input")
        items = (
            [raw]
            if isinstance(raw, str) or (isinstance(raw, list) and raw and isinstance(raw[0], int))
            else raw
        )
        if not isinstance(items, list) or not items or not isinstance(req.get("model"), str):
            send(openai_error(400, "'model' and 'input' are required.", "invalid_request_error", None))
            return
        self.requests.append({"path": "/v1/embeddings", "body": req})
        requested = req.get("dimensions")
        dims: int = requested if isinstance(requested, int) and requested > 0 else 64
        as_base64 = req.get("encoding_format") == "base64"
        data = []
        tokens = 0
        for index, item in enumerate(items):
            text = item if isinstance(item, str) else " ".join(map(str, item))
            tokens += count_tokens(text) if isinstance(item, str) else len(item)
            vector = _vector(text.encode(), dims)
            embedding: Any = (
                base64.b64encode(struct.pack(f"<{dims}f", *vector)).decode() if as_base64 else vector
            )
            data.append({"object": "embedding", "index": index, "embedding": embedding})
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        send(full(200, orjson.dumps({"object": "list", "data": data, "model": req["model"], "usage": usage})))

    async def _speech(self, headers: dict[str, str], body: bytes, send: Callable[[bytes], None]) -> None:
        """Audio for a text: a WAV tone, raw PCM, or silent MP3 frames (the API's default format), 20 ms of
        sound per character, sent in chunks as a streaming upstream does."""
        req = _json_object(body, send)
        if req is None:
            return
        text, voice = req.get("input"), req.get("voice")
        if not isinstance(text, str) or not text or not voice or not isinstance(req.get("model"), str):
            send(openai_error(400, "model, input and voice are required", "invalid_request_error", None))
            return
        self.requests.append({"path": "/v1/audio/speech", "body": req})
        try:
            _, d = directives.parse(req["model"], headers.get("x-sim"), text)
        except DirectiveError as exc:
            send(openai_error(400, str(exc), "invalid_request_error", None))
            return
        if d.fail is not None:
            send(openai_error(d.fail, f"Simulated failure {d.fail}.", "server_error", None))
            return
        fmt = req.get("response_format", "mp3")
        if req.get("stream_format") == "sse" or fmt not in _AUDIO_TYPES:
            send(
                openai_error(
                    400,
                    "The simulator renders mp3, wav and pcm audio, not SSE.",
                    "invalid_request_error",
                    None,
                )
            )
            return
        audio = _audio(fmt, seconds=min(len(text) * 0.02, 30.0))
        send(head(200, [("content-type", _AUDIO_TYPES[fmt]), ("transfer-encoding", "chunked")]))
        for start in range(0, len(audio), 8192):
            if d.pace:
                await asyncio.sleep(d.pace)
            piece = audio[start : start + 8192]
            send(chunk(piece))
        send(END_OF_CHUNKS)

    def _transcription(self, headers: dict[str, str], body: bytes, send: Callable[[bytes], None]) -> None:
        answer, record = transcription.transcribe(headers.get("content-type", ""), body)
        if record is not None:
            self.requests.append(record)
            try:
                fields = record["body"]
                _, d = directives.parse(fields["model"], headers.get("x-sim"), fields.get("prompt"))
            except DirectiveError as exc:
                send(openai_error(400, str(exc), "invalid_request_error", None))
                return
            if d.fail is not None:
                send(openai_error(d.fail, f"Simulated failure {d.fail}.", "server_error", None))
                return
        send(full(answer.status, answer.body, answer.content_type))

    def _rerank(self, body: bytes, send: Callable[[bytes], None]) -> None:
        """Cohere's rerank answer; relevance is the share of query words a document contains."""
        req = _json_object(body, send)
        if req is None:
            return
        query, documents = req.get("query"), req.get("documents")
        if not isinstance(query, str) or not isinstance(documents, list) or not documents:
            send(openai_error(400, "query and documents are required", "invalid_request_error", None))
            return
        self.requests.append({"path": "/v1/rerank", "body": req})
        texts = [
            d if isinstance(d, str) else str(d.get("text", "")) if isinstance(d, dict) else ""
            for d in documents
        ]
        words = set(re.findall(r"\w+", query.lower()))
        scored = []
        for index, text in enumerate(texts):
            overlap = len(words & set(re.findall(r"\w+", text.lower()))) / (len(words) or 1)
            tie = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=2).digest()) / 65535 / 1000
            scored.append((round(min(overlap * 0.998 + tie, 1.0), 6), index))
        scored.sort(key=lambda s: (-s[0], s[1]))
        top_n = req.get("top_n")
        if isinstance(top_n, int) and top_n > 0:
            scored = scored[:top_n]
        results = []
        for score, index in scored:
            result: dict[str, Any] = {"index": index, "relevance_score": score}
            if req.get("return_documents"):
                result["document"] = {"text": texts[index]}
            results.append(result)
        tokens = sum(count_tokens(query) + count_tokens(t) for t in texts)
        meta = {
            "api_version": {"version": "1"},
            "billed_units": {"search_units": -(-len(texts) // 100)},
            "tokens": {"input_tokens": tokens},
        }
        rid = "rerank-sim" + hashlib.blake2b(body, digest_size=8).hexdigest()
        send(full(200, orjson.dumps({"id": rid, "results": results, "meta": meta})))

    async def _messages(
        self, headers: dict[str, str], body: bytes, send: Callable[[bytes], None], abort: Callable[[], None]
    ) -> None:
        """Anthropic's Messages API: its body, its event names, its error format."""
        try:
            req = orjson.loads(body)
        except orjson.JSONDecodeError:
            req = None
        if not isinstance(req, dict) or not isinstance(req.get("model"), str):
            send(_anthropic_error(400, "model: Field required", "invalid_request_error"))
            return
        messages = req.get("messages")
        max_tokens = req.get("max_tokens")
        if not isinstance(messages, list) or not messages or not isinstance(max_tokens, int):
            send(_anthropic_error(400, "messages and max_tokens are required", "invalid_request_error"))
            return
        self.requests.append(
            {
                "path": "/v1/messages",
                "body": req,
                "x-api-key": headers.get("x-api-key"),
                "anthropic-version": headers.get("anthropic-version"),
            }
        )
        try:
            model, d = directives.parse(req["model"], headers.get("x-sim"), _last_text(messages))
        except DirectiveError as exc:
            send(_anthropic_error(400, str(exc), "invalid_request_error"))
            return
        if d.ttft:
            await asyncio.sleep(d.ttft)
        if d.fail is not None:
            kind = (
                "rate_limit_error" if d.fail == 429 else "overloaded_error" if d.fail == 529 else "api_error"
            )
            send(_anthropic_error(d.fail, f"Simulated failure {d.fail}.", kind))
            return
        if d.refuse:  # what Anthropic answers when its content filter blocks the output
            send(_anthropic_error(400, "Output blocked by content filtering policy", "invalid_request_error"))
            return
        n = min(d.tokens, max_tokens) if max_tokens > 0 else d.tokens
        words = _text(body, n)
        thinking = _text(body, d.reasoning, offset=3)
        stop = "max_tokens" if n < d.tokens else "end_turn"
        schema = structured.requested_schema(req, "messages")
        if schema is not None:  # JSON for the schema, whole whatever the length
            words, stop = structured.pieces(structured.answer_text(schema, words)), "end_turn"
        call = tools.anthropic_tool_call(req, d.tool, body)
        if call is not None:
            stop = "tool_use"
        prompt = [{"role": "system", "content": req["system"]}] if isinstance(req.get("system"), str) else []
        input_tokens = count_chat_tokens(orjson.dumps({"messages": prompt + messages}))
        output_tokens = count_tokens("".join(words) if call is None else call.arguments_json) + (
            count_tokens("".join(thinking)) if thinking else 0
        )
        mid = "msg_sim" + hashlib.blake2b(body, digest_size=10).hexdigest()
        usage = {
            "input_tokens": input_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": output_tokens,
        }
        if req.get("stream") is not True:
            content: list[dict[str, Any]] = []
            if thinking:
                content.append({"type": "thinking", "thinking": "".join(thinking), "signature": "sim"})
            content.append(
                {"type": "text", "text": "".join(words)} if call is None else call.tool_use_block()
            )
            send(
                full(
                    200,
                    orjson.dumps(
                        {
                            "id": mid,
                            "type": "message",
                            "role": "assistant",
                            "model": model,
                            "content": content,
                            "stop_reason": stop,
                            "stop_sequence": None,
                            "usage": usage,
                        }
                    ),
                )
            )
            return
        send(head(200, SSE_HEAD))

        def event(name: str, data: dict[str, Any]) -> None:
            payload = b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"
            send(chunk(payload))

        event(
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": mid,
                    "type": "message",
                    "role": "assistant",
                    "content": [],
                    "model": model,
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {**usage, "output_tokens": 1},
                },
            },
        )
        answer = (
            ({"type": "text", "text": ""}, "text_delta", "text", words)
            if call is None
            else (
                {**call.tool_use_block(), "input": {}},
                "input_json_delta",
                "partial_json",
                call.fragments(),
            )
        )
        blocks = (
            [({"type": "thinking", "thinking": ""}, "thinking_delta", "thinking", thinking)]
            if thinking
            else []
        ) + [answer]

        def fail() -> None:
            error = {"type": "overloaded_error", "message": "Simulated failure mid-stream."}
            event("error", {"type": "error", "error": error})
            send(END_OF_CHUNKS)

        sent = 0
        for index, (start, delta_type, field, pieces) in enumerate(blocks):
            event(
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": start},
            )
            if index == 0:
                event("ping", {"type": "ping"})
            for piece in pieces:
                if not await directives.before_piece(d, sent, abort, fail):
                    return
                event(
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": delta_type, field: piece},
                    },
                )
                sent += 1
            event("content_block_stop", {"type": "content_block_stop", "index": index})
        event(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                # The real API repeats the input and cache counts here (cumulative usage).
                "usage": usage,
            },
        )
        event("message_stop", {"type": "message_stop"})
        send(END_OF_CHUNKS)

    async def _chat(
        self, headers: dict[str, str], body: bytes, send: Callable[[bytes], None], abort: Callable[[], None]
    ) -> None:
        req = _json_object(body, send)
        if req is None:
            return
        if not isinstance(req.get("model"), str) or not isinstance(req.get("messages"), list):
            send(openai_error(400, "'model' and 'messages' are required.", "invalid_request_error", None))
            return
        self.requests.append(
            {
                "path": "/v1/chat/completions",
                "body": req,
                "authorization": headers.get("authorization"),
                "traceparent": headers.get("traceparent"),
            }
        )
        try:
            model, d = directives.parse(req["model"], headers.get("x-sim"), _last_text(req["messages"]))
        except DirectiveError as exc:
            send(openai_error(400, str(exc), "invalid_request_error", None))
            return
        if d.ttft:
            await asyncio.sleep(d.ttft)
        if d.fail is not None:
            send(
                openai_error(
                    d.fail,
                    f"Simulated failure {d.fail}.",
                    "rate_limit_error" if d.fail == 429 else "server_error",
                    None,
                )
            )
            return
        if d.refuse:  # OpenAI's refusal under its content policy
            send(
                openai_error(
                    400,
                    "Your request was rejected as a result of our safety system. Your prompt may contain "
                    "text that is not allowed by our safety system.",
                    "invalid_request_error",
                    "content_policy_violation",
                )
            )
            return
        cap = req.get("max_completion_tokens") or req.get("max_tokens")
        n = min(d.tokens, cap) if isinstance(cap, int) and cap > 0 else d.tokens
        words = _text(body, n)
        reasoning = _text(body, d.reasoning, offset=3)
        finish = "length" if n < d.tokens else "stop"
        schema = structured.requested_schema(req, "chat")
        if schema is not None:  # JSON for the schema, whole whatever the length
            words, finish = structured.pieces(structured.answer_text(schema, words)), "stop"
        call = tools.openai_tool_call(req, d.tool, body)
        if call is not None:
            finish = "tool_calls"
        prompt_tokens = count_chat_tokens(body)
        created = int(time.time())
        cid = "chatcmpl-sim" + hashlib.blake2b(body, digest_size=10).hexdigest()
        if req.get("stream") is True:
            opts = req.get("stream_options")
            with_usage = isinstance(opts, dict) and opts.get("include_usage") is True
            await self._chat_stream(
                cid, created, model, words, reasoning, call, finish, prompt_tokens, with_usage, d, send, abort
            )
            return
        text = "".join(words) if call is None else call.arguments_json
        message: dict[str, Any] = {
            "role": "assistant",
            "content": text if call is None else None,
            "refusal": None,
            "annotations": [],
        }
        if call is not None:
            message["tool_calls"] = [call.chat_tool_call()]
        if reasoning:
            message["reasoning_content"] = "".join(reasoning)
        completion = count_tokens(text) + (count_tokens("".join(reasoning)) if reasoning else 0)
        send(
            full(
                200,
                orjson.dumps(
                    {
                        "id": cid,
                        "object": "chat.completion",
                        "created": created,
                        "model": model,
                        "choices": [
                            {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
                        ],
                        "usage": _usage(
                            prompt_tokens, completion, count_tokens("".join(reasoning)) if reasoning else 0
                        ),
                        "service_tier": "default",
                        "system_fingerprint": "fp_sim",
                    }
                ),
            )
        )

    async def _chat_stream(
        self,
        cid: str,
        created: int,
        model: str,
        words: list[str],
        reasoning: list[str],
        call: ToolCall | None,
        finish: str,
        prompt_tokens: int,
        with_usage: bool,
        d: Directives,
        send: Callable[[bytes], None],
        abort: Callable[[], None],
    ) -> None:
        send(head(200, SSE_HEAD))
        base = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "service_tier": "default",
            "system_fingerprint": "fp_sim",
        }
        if with_usage:
            base["usage"] = None

        def event(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
            body = {
                **base,
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
            }
            return b"data: " + orjson.dumps(body) + b"\n\n"

        def frame(data: bytes) -> None:
            send(chunk(data))

        frame(event({"role": "assistant", "content": "" if call is None else None, "refusal": None}))
        answer = [{"content": w} for w in words] if call is None else call.chat_deltas()
        deltas = [{"reasoning_content": w} for w in reasoning] + answer

        def fail() -> None:
            error = {
                "message": "Simulated failure mid-stream.",
                "type": "server_error",
                "param": None,
                "code": None,
            }
            frame(b"data: " + orjson.dumps({"error": error}) + b"\n\n")
            send(END_OF_CHUNKS)

        for i, delta in enumerate(deltas):
            if not await directives.before_piece(d, i, abort, fail):
                return
            frame(event(delta))
        frame(event({}, finish))
        if with_usage:
            reasoning_tokens = count_tokens("".join(reasoning)) if reasoning else 0
            completion = (
                count_tokens("".join(words) if call is None else call.arguments_json) + reasoning_tokens
            )
            frame(
                b"data: "
                + orjson.dumps(
                    {**base, "choices": [], "usage": _usage(prompt_tokens, completion, reasoning_tokens)}
                )
                + b"\n\n"
            )
        frame(b"data: [DONE]\n\n")
        send(END_OF_CHUNKS)


def _usage(prompt: int, completion: int, reasoning: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": reasoning,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


class _Connection(asyncio.Protocol):
    """HTTP/1.1 with keep-alive; requests on one connection are answered in order."""

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.busy = False
        self.closed = False
        self.keep_alive = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.busy:
            self._next()

    def _send(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    def _abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()
        self.closed = True

    def _next(self) -> None:
        while not self.closed:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buffer) > _MAX_HEAD:
                    self._send(openai_error(431, "Request head too large.", "invalid_request_error", None))
                    self._abort()
                return
            head = bytes(self.buffer[:end]).decode("latin-1").split("\r\n")
            try:
                method, target, _ = head[0].split(" ", 2)
            except ValueError:
                self._send(openai_error(400, "Malformed request line.", "invalid_request_error", None))
                self._abort()
                return
            headers = {}
            for line in head[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            if "chunked" in headers.get("transfer-encoding", "").lower():
                self._send(
                    openai_error(
                        501, "Chunked request bodies are not supported.", "invalid_request_error", None
                    )
                )
                self._abort()
                return
            length = int(headers.get("content-length", "0") or 0)
            if len(self.buffer) < end + 4 + length:
                return
            body = bytes(self.buffer[end + 4 : end + 4 + length])
            del self.buffer[: end + 4 + length]
            self.busy = True
            task = asyncio.ensure_future(
                self.sim.handle(method, target, headers, body, self._send, self._abort)
            )
            self.keep_alive = headers.get("connection", "").lower() != "close"
            task.add_done_callback(self._done)
            return

    def _done(self, task: asyncio.Future[None]) -> None:
        self.busy = False
        if not task.cancelled() and task.exception() is not None:
            # A bug in a handler; part of an answer may be out already, so only a cut is honest.
            self._abort()
            return
        if not self.keep_alive and self.transport is not None:
            self.transport.close()
            self.closed = True
        elif self.buffer:
            self._next()


async def serve(
    host: str, port: int, sim: Simulator | None = None, *, reuse_port: bool = False
) -> asyncio.Server:
    simulator = sim or Simulator()
    loop = asyncio.get_running_loop()
    return await loop.create_server(
        lambda: _Connection(simulator), host, port, reuse_port=reuse_port, backlog=4096
    )


def run(host: str, port: int) -> None:
    """Serve until interrupted (`gateway sim`)."""
    import uvloop

    async def main() -> None:
        server = await serve(host, port)
        print(f"simulator listening on http://{host}:{port}", flush=True)
        async with server:
            await server.serve_forever()

    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(main())

"""The simulator's OpenAI audio transcription endpoint: a multipart upload in, deterministic text out.

The "transcript" is words chosen from a hash of the audio bytes, about two and a half per second of
audio, so the same file always gives the same text. Usage is reported as OpenAI does: by duration for
whisper models, by tokens for the gpt-4o-transcribe family.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from ..core import count_tokens, parse_multipart, wav_seconds
from . import directives
from .directives import DirectiveError
from .wire import Answer, error_answer, openai_error, respond
from .words import pick

if TYPE_CHECKING:
    from .state import Simulator

FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
_PLAIN = "text/plain; charset=utf-8"


async def create(sim: Simulator, request: web.Request) -> web.StreamResponse:
    """POST .../audio/transcriptions (multipart)."""
    answer, record = transcribe(request.headers.get("content-type", ""), await request.read())
    sim.record(record)
    if record is not None:
        fields = record["body"]
        try:
            _, d = directives.parse(fields["model"], request.headers.get("x-sim"), fields.get("prompt"))
        except DirectiveError as exc:
            return openai_error(400, str(exc))
        if d.fail is not None:
            return openai_error(d.fail, f"Simulated failure {d.fail}.", "server_error")
    return respond(answer)


def transcribe(content_type: str, body: bytes) -> tuple[Answer, dict[str, Any] | None]:
    """The answer to one request, and what to record of the request (None when it was refused)."""
    parts = parse_multipart(body, content_type) if content_type.startswith("multipart/form-data") else None
    if parts is None:
        return error_answer("Could not parse multipart form"), None
    fields = {p.name: p.data.decode(errors="replace") for p in parts if p.filename is None}
    upload = next((p for p in parts if p.name == "file" and p.filename is not None), None)
    if "model" not in fields or upload is None or not upload.data:
        return error_answer("model and file are required", "file"), None
    record = {
        "path": "/v1/audio/transcriptions",
        "body": fields,
        "file": {"filename": upload.filename, "content_type": upload.content_type, "size": len(upload.data)},
    }
    fmt = fields.get("response_format", "json")
    if fmt not in FORMATS:
        return error_answer(f"response_format must be one of {', '.join(FORMATS)}", "response_format"), record

    seconds = wav_seconds(upload.data) or len(upload.data) / 16_000  # else: as 128 kbit/s audio
    words = pick(upload.data, max(1, min(400, round(seconds * 2.5))))
    text = " ".join(words)
    if fmt == "text":
        return Answer(200, text.encode() + b"\n", _PLAIN), record
    if fmt in ("srt", "vtt"):
        return Answer(200, _subtitles(fmt, words, seconds).encode(), _PLAIN), record

    usage: dict[str, Any]
    if "gpt-4o" in fields["model"]:
        audio_tokens = max(1, math.ceil(seconds * 10))
        output = count_tokens(text)
        usage = {
            "type": "tokens",
            "input_tokens": audio_tokens,
            "input_token_details": {"audio_tokens": audio_tokens, "text_tokens": 0},
            "output_tokens": output,
            "total_tokens": audio_tokens + output,
        }
    else:
        usage = {"type": "duration", "seconds": math.ceil(seconds)}
    answer: dict[str, Any] = {"text": text, "usage": usage}
    if fmt == "verbose_json":
        answer = {
            "task": "transcribe",
            "language": fields.get("language", "english"),
            "duration": round(seconds, 2),
            "text": text,
            "segments": [
                {
                    "id": 0,
                    "seek": 0,
                    "start": 0.0,
                    "end": round(seconds, 2),
                    "text": text,
                    "tokens": [],
                    "temperature": 0.0,
                    "avg_logprob": -0.2,
                    "compression_ratio": 1.2,
                    "no_speech_prob": 0.01,
                }
            ],
            "usage": usage,
        }
    return Answer(200, orjson.dumps(answer)), record


def _subtitles(fmt: str, words: list[str], seconds: float) -> str:
    """One cue per eight words, spread evenly over the audio."""
    cues = [words[i : i + 8] for i in range(0, len(words), 8)]
    step = seconds / len(cues)
    sep = "," if fmt == "srt" else "."
    out = ["WEBVTT\n"] if fmt == "vtt" else []
    for n, cue in enumerate(cues):
        start, end = _stamp(n * step, sep), _stamp((n + 1) * step, sep)
        out.append(("" if fmt == "vtt" else f"{n + 1}\n") + f"{start} --> {end}\n{' '.join(cue)}\n")
    return "\n".join(out)


def _stamp(t: float, sep: str) -> str:
    ms = round(t * 1000)
    return f"{ms // 3_600_000:02}:{ms // 60_000 % 60:02}:{ms // 1000 % 60:02}{sep}{ms % 1000:03}"

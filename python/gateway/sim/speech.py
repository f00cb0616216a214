"""OpenAI's speech API (POST .../audio/speech): audio for a text, streamed in chunks as the real
upstream sends it. A WAV tone, raw PCM, or silent MP3 frames (the API's default format), 20 ms of
sound per character."""

from __future__ import annotations

import asyncio
import math
import struct
from typing import TYPE_CHECKING

from aiohttp import web

from . import directives
from .directives import DirectiveError
from .wire import EventStream, bad_json, json_object, openai_error

if TYPE_CHECKING:
    from .state import Simulator

CONTENT_TYPES = {"mp3": "audio/mpeg", "wav": "audio/wav", "pcm": "audio/pcm"}
RATE = 24_000  # samples per second, 16-bit mono, as the API's pcm format
MAX_SECONDS = 30.0
PIECE = 8192  # bytes per streamed chunk
# An MPEG-1 Layer III frame header (128 kbit/s, 44.1 kHz, mono); all-zero side info and data is silence.
_MP3_FRAME = b"\xff\xfb\x90\xc0" + bytes(413)


async def create(sim: Simulator, request: web.Request) -> web.StreamResponse:
    req = json_object(await request.read())
    if req is None:
        return bad_json()
    text, voice = req.get("input"), req.get("voice")
    if not isinstance(text, str) or not text or not voice or not isinstance(req.get("model"), str):
        return openai_error(400, "model, input and voice are required")
    sim.record({"path": "/v1/audio/speech", "body": req})
    try:
        _, d = directives.parse(req["model"], request.headers.get("x-sim"), text)
    except DirectiveError as exc:
        return openai_error(400, str(exc))
    if d.fail is not None:
        return openai_error(d.fail, f"Simulated failure {d.fail}.", "server_error")
    fmt = req.get("response_format", "mp3")
    if req.get("stream_format") == "sse":
        return openai_error(400, "The simulator renders audio files, not SSE.", param="stream_format")
    if not isinstance(fmt, str) or fmt not in CONTENT_TYPES:
        return openai_error(400, "The simulator renders mp3, wav and pcm audio.", param="response_format")
    audio = render(fmt, seconds=min(len(text) * 0.02, MAX_SECONDS))
    if d.ttft:  # the model's time before its first audio
        await asyncio.sleep(d.ttft)
    stream = EventStream(request, CONTENT_TYPES[fmt])
    await stream.open()

    async def fail() -> None:  # no event format to carry an error in: the audio stops short
        stream.drop()

    for i, start in enumerate(range(0, len(audio), PIECE)):
        # pace, stall_after, drop_after and error_after count the audio's pieces.
        if not await directives.before_piece(d, i, stream.drop, fail):
            return stream.response
        await stream.send(audio[start : start + PIECE])
    return await stream.end()


def render(fmt: str, seconds: float) -> bytes:
    """`seconds` of audio in a format the API names: mp3, wav or pcm."""
    if fmt == "mp3":
        return _MP3_FRAME * max(1, round(seconds * 44_100 / 1152))
    n = int(seconds * RATE)
    pcm = b"".join(struct.pack("<h", int(8000 * math.sin(2 * math.pi * 440 * i / RATE))) for i in range(n))
    if fmt == "pcm":
        return pcm
    header = (
        b"RIFF"
        + struct.pack("<I", 36 + len(pcm))
        + b"WAVE"
        + b"fmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, RATE, RATE * 2, 2, 16)
        + b"data"
        + struct.pack("<I", len(pcm))
    )
    return header + pcm

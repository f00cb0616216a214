"""POST /v1/audio/transcriptions (Shape A): an uploaded audio file in, its text out.

The multipart body is parsed by the Rust core so that unsupported fields can be dropped (spec 1.3)
and the model's name replaced; the rest is sent on as it came, but for `response_format: text`:
a plain-text answer carries no usage, so the upstream is asked for JSON (which does) and its text
is sent as the client asked. Subtitles (srt, vtt) carry none either: they are billed the length
their last cue ends at.
"""

from __future__ import annotations

import math
import re

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .. import billing
from ..config import ModelConfig
from ..context import Call
from ..core import (
    AUDIO_TOKENS_PER_SECOND,
    MIN_AUDIO_BYTES_PER_SECOND,
    InvalidJsonError,
    count_tokens,
    set_json_id,
    wav_seconds,
)
from ..errors import GatewayError, invalid_request
from ..ids import response_id
from ..pricing import Usage, format_cost
from ..registry import REQUIRED_FIELDS
from ..state import GatewayState
from ..translate.usage import token_count
from .common import REQUEST_ID_HEADER, RESPONSE_ID_HEADER, model_endpoint, read_body, resolve_model
from .multipart import FormPart, channel_form, form_parts
from .upstream import call_upstream


def routes(state: GatewayState) -> list[Route]:
    async def transcriptions(request: Request, call: Call) -> Response:
        raw = await read_body(request, state.settings.max_request_bytes)
        content_type = request.headers.get("content-type", "")
        parts = form_parts(raw, content_type)
        if parts is None:
            raise invalid_request("The request must be a well-formed multipart/form-data body.")
        names = [p.data.decode(errors="replace") for p in parts if p.name == "model"]
        model = resolve_model(state, call, names[0] if names else None, "transcription")
        upload = next((p for p in parts if p.name == "file"), None)
        if upload is None or not upload.data or not upload.filename:
            raise invalid_request("`file` is required: the audio file to transcribe.", "file")
        if any(p.name == "stream" and p.data.strip().lower() in (b"true", b"1") for p in parts):
            # A client told it streams reads events; a JSON answer would read as none (and be paid).
            raise invalid_request(
                "This gateway does not stream transcriptions: leave out `stream` and read the whole answer.",
                "stream",
            )
        await billing.hold(state, call, model, _estimate(model, upload.data))

        kept = state.registry.form_parts(model, parts, REQUIRED_FIELDS["transcription"], call)
        as_text = any(p.name == "response_format" and p.data.strip() == b"text" for p in kept)
        form, form_type = channel_form(
            FormPart(
                p.name,
                b"json" if as_text and p.name == "response_format" else p.data,
                p.filename,
                p.content_type,
            )
            for p in kept
        )
        content, answer_type, _ = await call_upstream(state, request, call, model, form, form_type)
        rid = response_id("transcr-")
        is_json = answer_type.startswith("application/json")
        try:
            body = set_json_id(content, rid) if is_json else content
            text, reported = _read_answer(body) if is_json else (content.decode(errors="replace"), None)
        except (InvalidJsonError, orjson.JSONDecodeError, UnicodeDecodeError) as exc:
            raise GatewayError("provider_error", "The model's provider sent a malformed answer.") from exc
        if as_text and is_json:  # as OpenAI writes a text answer: the transcript and a newline
            body, answer_type, is_json = text.encode() + b"\n", "text/plain; charset=utf-8", False
        usage = reported or _counted(model, upload.data, text)
        if is_json:
            body = _with_usage(body, usage)
        charged = billing.settle(state, call, model, rid, "completed", usage)
        headers = {
            REQUEST_ID_HEADER: call.request_id,
            RESPONSE_ID_HEADER: rid,
            "x-service-cost": format_cost(charged),
        }
        return Response(body, media_type=answer_type, headers=headers)

    return [Route("/v1/audio/transcriptions", model_endpoint(state, transcriptions), methods=["POST"])]


def _read_answer(body: bytes) -> tuple[str, Usage | None]:
    """The text, and the usage OpenAI reports: by duration (whisper) or by tokens (gpt-4o-transcribe)."""
    data = orjson.loads(body)
    text = data.get("text") if isinstance(data, dict) else None
    usage = data.get("usage") if isinstance(data, dict) else None
    reported = None
    if (
        isinstance(usage, dict)
        and usage.get("type") == "duration"
        and isinstance(usage.get("seconds"), int | float)
    ):
        reported = Usage(seconds=math.ceil(usage["seconds"]))
    elif isinstance(usage, dict) and usage.get("type") == "tokens":
        # Of the input, its audio (gpt-4o-transcribe bills it at its own price).
        details = usage.get("input_token_details")
        reported = Usage(
            prompt_tokens=token_count(usage.get("input_tokens")),
            completion_tokens=token_count(usage.get("output_tokens")),
            audio_prompt_tokens=token_count(details.get("audio_tokens")) if isinstance(details, dict) else 0,
        )
    elif isinstance(data, dict) and isinstance(data.get("duration"), int | float):
        reported = Usage(seconds=math.ceil(data["duration"]))
    return (text if isinstance(text, str) else ""), reported


def _with_usage(body: bytes, usage: Usage) -> bytes:
    """A JSON answer without a `usage` object gets OpenAI's, for what the gateway billed (spec
    1.4.1): by duration when it billed seconds (a WAV's length, or verbose_json's `duration`), else
    by tokens."""
    if b'"usage"' in body:
        return body
    data = orjson.loads(body)
    if not isinstance(data, dict):
        return body
    if usage.seconds:
        data["usage"] = {"type": "duration", "seconds": usage.seconds}
    else:
        data["usage"] = {
            "type": "tokens",
            "input_tokens": usage.prompt_tokens,
            "output_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens,
        }
    return orjson.dumps(data)


def _estimate(model: ModelConfig, audio: bytes) -> Usage:
    """The most a transcription may cost: the WAV's duration (other formats: as long as their size
    allows at the lowest plausible bitrate), as seconds and as audio input tokens (models billed by
    tokens: gpt-4o-transcribe), and the model's longest output."""
    seconds = wav_seconds(audio)
    if seconds is None:
        seconds = len(audio) / MIN_AUDIO_BYTES_PER_SECOND
    heard = math.ceil(seconds * AUDIO_TOKENS_PER_SECOND)
    return Usage(
        prompt_tokens=heard,
        audio_prompt_tokens=heard,
        seconds=math.ceil(seconds),
        completion_tokens=model.max_output_tokens,
    )


# A subtitle cue's end (srt: 00:01:02,500; vtt: 00:01:02.500 or 01:02.500).
_CUE_END = re.compile(rb"-->\s*(?:(\d+):)?(\d{1,2}):(\d{2})[,.](\d{3})")


def _counted(model: ModelConfig, audio: bytes, text: str) -> Usage:
    """The gateway's own measure when the upstream reports none: the duration of a WAV upload, else
    where the answer's last subtitle cue ends (other formats would need decoding), and, for a model
    not priced by duration, the tokens of the text."""
    # The longer of the two: a WAV header cannot shorten what the subtitles show was heard.
    cue_end = _last_cue_end(text.encode())
    seconds = math.ceil(max(wav_seconds(audio) or 0.0, cue_end))
    if seconds and (model.prices.second or model.prices.minute):
        # Billed by duration, as such an upstream reports its usage (whisper: `type: duration`, no
        # tokens): the same audio costs the same in every format. A duration unknown here (not a
        # WAV, no subtitles) leaves the transcript's tokens, below.
        return Usage(seconds=seconds)
    words = _cue_text(text) if cue_end else text  # subtitles: their words, as json's text would be
    return Usage(seconds=seconds, completion_tokens=count_tokens(words, model.tokenizer))


def _cue_text(subtitles: str) -> str:
    """The words of an srt or vtt answer: its cues' lines, without their numbers, times and the
    WEBVTT header (a transcript's tokens are the same whichever format it came in)."""
    return "\n".join(
        line
        for line in (raw.strip() for raw in subtitles.splitlines())
        if line and "-->" not in line and not line.isdigit() and not line.startswith("WEBVTT")
    )


def _last_cue_end(subtitles: bytes) -> float:
    """Where the last cue of an srt or vtt answer ends, in seconds (0 without one)."""
    ends = [
        int(h or 0) * 3600 + int(m) * 60 + int(s) + int(ms) / 1000
        for h, m, s, ms in _CUE_END.findall(subtitles)
    ]
    return max(ends, default=0.0)

"""POST /v1/audio/speech (Shape A): text in, audio bytes out, streamed to the client as they arrive."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .. import billing, safety
from ..clock import instant_ns
from ..config import ChannelConfig
from ..context import Call
from ..core import count_tokens
from ..deadline import within
from ..errors import GatewayError, invalid_request
from ..ids import response_id
from ..pricing import Usage, cost, format_cost
from ..providers.http import UPSTREAM_FAILURES, UpstreamResponse, is_timeout
from ..state import GatewayState
from .common import (
    REQUEST_ID_HEADER,
    RESPONSE_ID_HEADER,
    HeldStream,
    model_endpoint,
    parse_object,
    read_body,
    resolve_model,
)
from .text import count_input
from .upstream import open_stream, window_closed, window_left

MAX_INPUT_CHARACTERS = 4096  # OpenAI's limit for one speech request


def routes(state: GatewayState) -> list[Route]:
    async def speech(request: Request, call: Call) -> Response:
        payload = parse_object(await read_body(request, state.settings.max_request_bytes))
        model = resolve_model(state, call, payload.get("model"), "speech")
        text = _validate(payload)
        await safety.check(state, request, call, model, payload)
        # The cost depends on the input alone: known before the model runs.
        usage = Usage(
            prompt_tokens=await count_input(
                state, request, call, model, lambda: count_tokens(text, model.tokenizer)
            ),
            characters=len(text),
        )
        await billing.hold(state, call, model, usage)
        body = state.registry.channel_body(model, payload, call)

        async def attempt(channel: ChannelConfig) -> UpstreamResponse:
            # The head within the synchronous window, whose end (below) comes first: 504 then.
            window = state.settings.sync_timeout_seconds
            answer = await open_stream(state, request, model, channel, body, head_within=window)
            if answer.headers.get("content-type", "").startswith("application/json"):
                # Audio or its events, never JSON: a 2xx JSON body is a failure said as success.
                answer.release()
                raise GatewayError(
                    "provider_error",
                    "The model's provider answered with an error instead of audio.",
                    retry="any",
                )
            return answer

        # Retried and failed over until the upstream answers (gateway.routing); the channel is
        # kept until the audio has been sent. The wait is the upstream's time (gateway.telemetry).
        # Its answer's head within the synchronous window (spec 8), from the request's start; then
        # the audio flows as a stream does, each piece within the stream idle time. A draining
        # worker's last moment ends the wait too (its length is the window's: gateway.drain).
        started = time.perf_counter_ns()
        try:
            with within(state.settings.sync_timeout_seconds):
                async with asyncio.timeout(window_left(state, call)):
                    upstream, slot = await state.router.run(model, attempt, call.attempts)
        except TimeoutError as exc:
            raise window_closed(state) from exc
        finally:
            call.upstream_ns += time.perf_counter_ns() - started
        rid = response_id("speech-")

        async def audio() -> AsyncGenerator[bytes, None]:
            # Settled when the audio has been sent, or the client left (the model ran): the
            # cost depends on the input alone. An upstream that breaks off is not charged; the
            # hold is released (HeldStream's on_end) and the answer ends cut short.
            broke = False
            try:
                async for chunk in upstream.content.iter_any():
                    if not call.first_byte_ns:
                        call.first_byte_ns = instant_ns()
                    yield chunk
            except UPSTREAM_FAILURES as exc:
                broke = True
                # Logged as the model's failure, not a client gone: silent past the stream idle
                # window (timeout, as a text stream's), or broken off.
                call.error_code = "timeout" if is_timeout(exc) else "provider_error"
                raise
            finally:
                upstream.release()
                if not broke:
                    billing.settle(state, call, model, rid, "completed", usage)

        headers = {
            REQUEST_ID_HEADER: call.request_id,
            RESPONSE_ID_HEADER: rid,
            "x-service-cost": format_cost(cost(model.prices, usage)),
        }
        media_type = upstream.headers.get("content-type", "application/octet-stream")

        def ended() -> None:
            upstream.release()
            slot.release()

        return HeldStream(audio(), ended, media_type=media_type, headers=headers)

    return [Route("/v1/audio/speech", model_endpoint(state, speech, idempotent=True), methods=["POST"])]


def _validate(payload: dict[str, Any]) -> str:
    text = payload.get("input")
    if not isinstance(text, str) or not text:
        raise invalid_request("`input` must be a non-empty string.", "input")
    if len(text) > MAX_INPUT_CHARACTERS:
        raise invalid_request(f"`input` is longer than {MAX_INPUT_CHARACTERS} characters.", "input")
    voice = payload.get("voice")
    if not (isinstance(voice, str) and voice) and not (isinstance(voice, dict) and voice.get("id")):
        raise invalid_request('`voice` is required: a voice name or {"id": ...}.', "voice")
    return text

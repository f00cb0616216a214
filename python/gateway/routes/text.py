"""What the text endpoints (chat completions, messages, responses) do before a request goes
upstream, whichever shape the model itself speaks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.requests import Request

from .. import billing, safety
from ..config import ModelConfig
from ..context import Call
from ..state import GatewayState


async def check_and_hold(
    state: GatewayState,
    request: Request,
    call: Call,
    model: ModelConfig,
    payload: dict[str, Any],
    endpoint_type: str,
    prompt_tokens: Callable[[], int],
    *limits: str,
) -> None:
    """A text request's way in: the safety check of `payload` (in the `endpoint_type` shape), then
    the hold of the most it may cost, its whole prompt and as much output as the first of its
    `limits` parameters allows (billing.estimate_usage). The prompt is counted only once the check
    has passed."""
    await safety.check(state, request, call, model, payload, endpoint_type)
    await billing.hold(state, call, model, billing.estimate_usage(model, prompt_tokens(), payload, *limits))

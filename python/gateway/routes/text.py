"""What the text endpoints (chat completions, messages, responses) do before a request goes
upstream, whichever shape the model itself speaks."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, TypeVar

from starlette.requests import Request

from .. import billing, request_log, safety
from ..config import ModelConfig
from ..context import Call
from ..state import GatewayState

T = TypeVar("T")

# A prompt in a body larger than this is counted in a thread, after the output alone was found
# covered. Counting is ~5 ms a MB of text, but up to a second a MB of one long run of a character
# (BPE merges a run piece by piece): on the event loop, one such request would hold up every other
# of its worker, and a key with nothing left would get its refusal only after the count.
LARGE_PROMPT_BYTES: Final = 256 * 1024
# The counting threads (the core lets go of the GIL while it counts) are the counts' own: in the
# event loop's shared executor, a few slow counts would hold up what else runs there (lease
# refills, reclaims, credential refreshes). Large counts beyond these wait their turn.
COUNTING_THREADS: Final = 2
_counting: ThreadPoolExecutor | None = None


def _counting_threads() -> ThreadPoolExecutor:
    global _counting  # noqa: PLW0603 (made on first use, in the worker process that counts)
    if _counting is None:
        _counting = ThreadPoolExecutor(COUNTING_THREADS, thread_name_prefix="gateway-prompt-count")
    return _counting


async def check_and_hold(
    state: GatewayState,
    request: Request,
    call: Call,
    model: ModelConfig,
    payload: dict[str, Any],
    endpoint_type: str,
    prompt_tokens: Callable[[], tuple[int, int]],
    *limits: str,
    brought: int = 0,
) -> int:
    """A text request's way in: the safety check of `payload` (in the `endpoint_type` shape), then
    the hold of the most it may cost, its whole prompt and as much output as the first of its
    `limits` parameters allows (billing.estimate_usage). The prompt is counted only once the check
    has passed (a large one in a thread, once the money covers the output: LARGE_PROMPT_BYTES):
    `prompt_tokens()` gives its tokens and, of them, its audio's (count_prompt_tokens).
    Returns that count: an upstream that reports no usage is billed from it, not from a second
    count (which would be made on the event loop). `brought` is the bytes of prompt the request
    names rather than sends (a kept conversation: routes/kept_responses.py), large like a body."""
    await safety.check(state, request, call, model, payload, endpoint_type)
    if _is_large(request, brought):
        await billing.check_output_covered(
            state, call, model, billing.estimate_usage(model, 0, payload, *limits)
        )
        prompt, audio = await _count_in_thread(prompt_tokens)
    else:  # no coroutine on the common path
        prompt, audio = prompt_tokens()
    call.prompt_audio = audio
    estimate = billing.estimate_usage(model, prompt, payload, *limits, audio_tokens=audio)
    await billing.hold(state, call, model, estimate)
    return prompt


async def count_input(
    state: GatewayState, request: Request, call: Call, model: ModelConfig, counted: Callable[[], T]
) -> T:
    """count_prompt for the endpoints whose cost is their input (embeddings, rerank, images,
    moderations, speech): a large body is counted only once the money covers its first token."""
    if _is_large(request):
        await billing.check_input_covered(state, call, model)
        return await _count_in_thread(counted)
    return counted()


async def count_prompt(request: Request, counted: Callable[[], T]) -> T:
    """`counted()` (a prompt's tokens, or a request's whole usage), in the counting threads when
    the request's body is large: a 10 MB input counts for seconds, which the event loop, and every
    other request of the worker, would wait out."""
    return await _count_in_thread(counted) if _is_large(request) else counted()


def _is_large(request: Request, brought: int = 0) -> bool:
    return len(request.scope.get(request_log.BODY_SCOPE_KEY, b"")) + brought > LARGE_PROMPT_BYTES


async def _count_in_thread(counted: Callable[[], T]) -> T:
    return await asyncio.get_running_loop().run_in_executor(_counting_threads(), counted)

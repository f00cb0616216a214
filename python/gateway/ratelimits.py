"""Per-key rate limits (spec 8): requests per minute and tokens per minute, values set on the
account, each of its keys limited on its own.

Both are token buckets (capacity = the per-minute value, refilled continuously at that rate) in a
store every process shares (gateway.buckets): the Rust core's file next to the SQLite database for
one machine (`FileBuckets`), or Redis for many instances (`gateway.redis_buckets`), so N workers
admit what one would. A model request takes one
request when it arrives and reserves tokens before it runs (reserved_tokens: its prompt plus the
output it may produce, as OpenAI counts max_tokens; a bounded default when it sets no limit); when
it ends the reservation is corrected to the tokens it used (none when it did not run), so the
bucket counts exactly what was used, going into debt when a request used more than it reserved.

A 429 rate_limited (with Retry-After: the whole seconds until the bucket holds what was asked for)
is only sent when waiting can help; a request that can never fit the limit is 400 invalid_request
naming what fits. Every answer to a key with limits carries the x-ratelimit-* headers
(gateway.ratelimit_headers adds them). When the store cannot be reached (Redis down), a key with
limits is answered 503 service_unavailable with Retry-After; a key without limits is not affected.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any, Final

from .buckets import BucketStore, FileBuckets
from .errors import GatewayError, ServiceUnavailable, invalid_request
from .estimates import DEFAULT_RESERVED_OUTPUT, TextEstimate, prompt_param
from .pricing import Usage
from .store import KeyContext
from .telemetry.metrics import RATE_LIMITED

MINUTE_NS = 60_000_000_000
log = logging.getLogger("gateway.ratelimits")
# Retry-After of a 503 when the buckets cannot be reached: a restarted Redis is back within seconds.
UNAVAILABLE_RETRY_SECONDS = 1


@dataclass(slots=True)
class RateState:
    """What one request has taken from its key's buckets, for its headers and its correction."""

    key_id: str
    rpm: int | None
    tpm: int | None
    remaining_requests: int = 0
    # None until read: a model request learns it when it reserves its tokens (RateLimiter.reserve),
    # so admitting it does not read the tokens bucket as well; an answer given before that reads it
    # then (RateLimiter.tokens_read).
    remaining_tokens: int | None = None
    reserved_tokens: int = 0
    corrected: bool = False
    # The buckets could not be reached for this request: its answer (a 503) shows no headers, rather
    # than wait for them a second time (outage review: a blackholed Redis held the 503 for 1 s).
    unreachable: bool = False
    # The correction under way in the store (Redis) when it was not made at once (RateLimiter.correct).
    correcting: asyncio.Task[None] | None = None

    def headers(self) -> dict[str, str]:
        headers = {}
        if self.rpm is not None:
            headers["x-ratelimit-limit-requests"] = str(self.rpm)
            headers["x-ratelimit-remaining-requests"] = str(self.remaining_requests)
        if self.tpm is not None:
            headers["x-ratelimit-limit-tokens"] = str(self.tpm)
            if self.remaining_tokens is not None:
                headers["x-ratelimit-remaining-tokens"] = str(self.remaining_tokens)
        return headers


# Where an HTTP request's scope keeps its KeySlot (gateway.ratelimit_headers puts one there).
SCOPE_KEY: Final = "gateway.key"


@dataclass(slots=True)
class KeySlot:
    """What is known, while one HTTP request is answered, of the key it presented: whether it was
    checked, the key when it was valid, and what a model request took from its buckets."""

    # When the request arrived, on the monotonic clock (clock.instant_ns): its log entry's start
    # (gateway.app._log_failure).
    started_ns: int = 0
    checked: bool = False
    ctx: KeyContext | None = None
    rate: RateState | None = None


def key_slot(scope: MutableMapping[str, Any]) -> KeySlot | None:
    slot = scope.get(SCOPE_KEY)
    return slot if isinstance(slot, KeySlot) else None


def note_rate(scope: MutableMapping[str, Any], rate: RateState | None) -> None:
    """A model request's take from its key's buckets: its answer's headers show it."""
    slot = key_slot(scope)
    if slot is not None:
        slot.rate = rate


class RateLimiter:
    """The rate limits of keys over a bucket store (gateway.buckets). `now_ns` is a clock for tests;
    without one each store reads its own (the wall clock: the file outlives processes and reboots,
    which a monotonic clock does not; Redis's clock for Redis, one clock for every instance)."""

    def __init__(self, buckets: BucketStore, now_ns: Callable[[], int] | None = None) -> None:
        self._buckets = buckets
        self._file = buckets if isinstance(buckets, FileBuckets) else None
        self._now_ns = now_ns
        self._corrections: set[asyncio.Task[None]] = set()

    def _now(self) -> int | None:
        return None if self._now_ns is None else self._now_ns()

    async def admit(self, ctx: KeyContext, scope: MutableMapping[str, Any] | None = None) -> RateState | None:
        """Take one request from the key's requests bucket, or refuse with 429 (503 when the
        buckets cannot be reached: the request's KeySlot in `scope` then says so). None when the
        key's account sets no limits. The tokens bucket is left for the reservation (`reserve`):
        one operation on the buckets fewer a request."""
        rpm, tpm = ctx.account.rpm_limit, ctx.account.tpm_limit
        if rpm is None and tpm is None:
            return None
        state = RateState(ctx.key.id, rpm, tpm)
        now = self._now()
        try:
            if rpm is not None:
                taken = await self._buckets.try_take(_requests(state), rpm, rpm, MINUTE_NS, 1, now)
                state.remaining_requests = taken.remaining
                if not taken.allowed:
                    await self.tokens_read(state)
                    raise _refused(state, taken.retry_after_ns, f"{rpm} requests per minute", "requests")
        except OSError as exc:
            if scope is not None:
                note_rate(scope, state)
            raise _unavailable(state, exc) from exc
        return state

    async def tokens_read(self, state: RateState) -> None:
        """Read the tokens the key's bucket holds when the request has not learnt them yet (its
        answer comes before its reservation). Raises OSError when the buckets cannot be reached."""
        if state.tpm is not None and state.remaining_tokens is None:
            state.remaining_tokens = await self._buckets.available(
                _tokens(state), state.tpm, state.tpm, MINUTE_NS, self._now()
            )

    async def peek(self, ctx: KeyContext) -> RateState | None:
        """The key's buckets as they stand, taking nothing (for the headers of an answer that is not
        a model request). None when the key's account sets no limits. Raises OSError when the
        buckets cannot be reached."""
        rpm, tpm = ctx.account.rpm_limit, ctx.account.tpm_limit
        if rpm is None and tpm is None:
            return None
        state = RateState(ctx.key.id, rpm, tpm)
        now = self._now()
        if rpm is not None:
            state.remaining_requests = await self._buckets.available(
                _requests(state), rpm, rpm, MINUTE_NS, now
            )
        if tpm is not None:
            state.remaining_tokens = await self._buckets.available(_tokens(state), tpm, tpm, MINUTE_NS, now)
        return state

    async def reserve(self, state: RateState | None, estimate: Usage, model_type: str) -> None:
        """Reserve the tokens the request may use (reserved_tokens), or refuse it: 400
        invalid_request when it can never fit the key's limit, 429 when the bucket does not hold them
        now (then the request it took is given back: it never ran), 503 when the buckets cannot be
        reached."""
        if state is None or state.tpm is None:
            return
        tokens = reserved_tokens(estimate, state.tpm, model_type)
        now = self._now()
        try:
            taken = await self._buckets.try_take(_tokens(state), state.tpm, state.tpm, MINUTE_NS, tokens, now)
            state.remaining_tokens = taken.remaining
            if not taken.allowed:
                if state.rpm is not None:
                    state.remaining_requests = await self._buckets.adjust(
                        _requests(state), state.rpm, state.rpm, MINUTE_NS, 1, now
                    )
                raise _refused(
                    state,
                    taken.retry_after_ns,
                    f"{state.tpm} tokens per minute; this request reserves {tokens} tokens",
                    "tokens",
                )
        except OSError as exc:
            raise _unavailable(state, exc) from exc
        state.reserved_tokens = tokens

    def correct(self, state: RateState | None, used_tokens: int) -> None:
        """The request has ended having used `used_tokens`: give back the rest of its reservation
        (or take what it used beyond it). Once per request; never fails the request (it is done
        and charged). Not awaited, as it runs where the request ends (billing, a stream's end): the
        file corrects at once; Redis as a task of its own, which `corrected(state)` waits for (the
        headers of a plain answer show the corrected bucket)."""
        if state is None or state.tpm is None or state.corrected or not state.reserved_tokens:
            return
        state.corrected = True
        delta = state.reserved_tokens - used_tokens
        if not delta:
            return
        if self._file is not None:
            try:
                state.remaining_tokens = self._file.adjust_now(
                    _tokens(state), state.tpm, state.tpm, MINUTE_NS, delta, self._now()
                )
            except OSError:
                log.exception("correcting the tokens of key %s failed", state.key_id)
            return
        task = asyncio.create_task(self._correct(state, state.tpm, delta, self._now()))
        state.correcting = task
        self._corrections.add(task)
        task.add_done_callback(self._corrections.discard)

    async def _correct(self, state: RateState, tpm: int, delta: int, now: int | None) -> None:
        try:
            state.remaining_tokens = await self._buckets.adjust(
                _tokens(state), tpm, tpm, MINUTE_NS, delta, now
            )
        except OSError as exc:  # the bucket keeps the reservation: it refills within the minute
            log.warning("correcting the tokens of key %s failed: %s", state.key_id, exc)
        except Exception:  # never the answer's failure: it is done and charged
            log.exception("correcting the tokens of key %s failed", state.key_id)

    async def corrected(self, state: RateState) -> None:
        """Wait for the request's correction when it is under way."""
        if state.correcting is not None:
            await asyncio.shield(state.correcting)

    async def drain(self) -> None:
        """Wait for every correction under way (at shutdown, before the store's client closes)."""
        while self._corrections:
            await asyncio.gather(*self._corrections, return_exceptions=True)


def reserved_tokens(estimate: Usage, tpm: int, model_type: str) -> int:
    """The tokens a request reserves against a limit of `tpm` a minute, or 400 invalid_request when
    it can never fit it (waiting cannot help, so it must not be a 429).

    A text request that sets its output limit reserves its prompt plus that limit (for each choice),
    as OpenAI counts max_tokens; when that is more than the whole limit it is refused, naming the
    largest value that fits. A request that sets none (and every other kind: images, transcription)
    reserves its prompt plus DEFAULT_RESERVED_OUTPUT per choice, never more than the model's longest
    answer nor more than the limit leaves beside the prompt: so it fits whenever its prompt does. A
    prompt that leaves no room for output (a text request needs at least a token per choice) can
    never run either."""
    prompt, output = estimate.prompt_tokens, estimate.completion_tokens
    text = isinstance(estimate, TextEstimate)
    choices = estimate.choices if isinstance(estimate, TextEstimate) else 1
    least = choices if text and output else 0
    if prompt + least > tpm:
        where = prompt_param(model_type)
        room = "leaves no room for output within" if prompt <= tpm else "is more than"
        raise invalid_request(
            f"The request's prompt ({where or 'its input'}) alone is {prompt} tokens, which {room}"
            f" this key's limit of {tpm} tokens per minute: it can never run. Shorten it, or ask for"
            " a higher limit.",
            where,
        )
    if isinstance(estimate, TextEstimate) and estimate.limit_set is not None:
        if prompt + output > tpm:
            each = f" for each of its {choices} choices" if choices > 1 else ""
            raise invalid_request(
                f"This request may use up to {prompt + output} tokens ({prompt} of prompt and"
                f" {output} of output), more than this key's limit of {tpm} tokens per minute: it"
                f" can never run. Set {estimate.limit_set} to at most {(tpm - prompt) // choices}"
                f"{each}.",
                estimate.limit_set,
            )
        return prompt + output
    return prompt + min(output, DEFAULT_RESERVED_OUTPUT * choices, tpm - prompt)


def _requests(state: RateState) -> str:
    return state.key_id + ":requests"


def _tokens(state: RateState) -> str:
    return state.key_id + ":tokens"


def _unavailable(state: RateState, exc: OSError) -> GatewayError:
    """Nothing can be admitted while the buckets cannot be reached: the request is refused before
    it runs, so it is never charged, and may be sent again in a moment."""
    log.warning("the rate limits of key %s cannot be checked: %s", state.key_id, exc)
    state.unreachable = True
    return ServiceUnavailable("rate-limit store", UNAVAILABLE_RETRY_SECONDS)


def _refused(state: RateState, retry_after_ns: int, what: str, limit: str) -> GatewayError:
    RATE_LIMITED.labels(limit).inc()  # the metrics' refusals by limit (requests or tokens)
    seconds = max(1, math.ceil(retry_after_ns / 1_000_000_000))
    return GatewayError(
        "rate_limited",
        f"Rate limit reached for this key: {what}. Retry after {seconds} s.",
        headers={**state.headers(), "retry-after": str(seconds)},
    )

"""Per-key rate limits (spec 8): requests per minute and tokens per minute, values set on the
account, each of its keys limited on its own.

Both are token buckets (capacity = the per-minute value, refilled continuously at that rate) held by
the Rust core in a file shared by every worker process of the gateway (`SharedBuckets`, next to the
database), so N workers admit what one would, with no external service. A request takes one request
when it arrives and reserves its estimated tokens (the prompt plus the most output it may produce,
as the holds estimate it) before it runs; when it ends the reservation is corrected to the tokens
it used (none when it did not run).

A refusal is 429 rate_limited with Retry-After: the whole seconds until the bucket holds what was
asked for. Every answer to a key with limits carries the x-ratelimit-* headers.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ._core import SharedBuckets
from .errors import GatewayError
from .store import KeyContext

MINUTE_NS = 60_000_000_000
log = logging.getLogger("gateway.ratelimits")
# Slots in the shared table: two per key in use (a few MB of sparse file at most).
SLOTS = 65_536


@dataclass(slots=True)
class RateState:
    """What one request has taken from its key's buckets, for its headers and its correction."""

    key_id: str
    rpm: int | None
    tpm: int | None
    remaining_requests: int = 0
    remaining_tokens: int = 0
    reserved_tokens: int = 0
    corrected: bool = False

    def headers(self) -> dict[str, str]:
        headers = {}
        if self.rpm is not None:
            headers["x-ratelimit-limit-requests"] = str(self.rpm)
            headers["x-ratelimit-remaining-requests"] = str(self.remaining_requests)
        if self.tpm is not None:
            headers["x-ratelimit-limit-tokens"] = str(self.tpm)
            headers["x-ratelimit-remaining-tokens"] = str(self.remaining_tokens)
        return headers


class RateLimiter:
    def __init__(self, path: Path, now_ns: Callable[[], int] = time.time_ns) -> None:
        # Wall-clock time: the table outlives processes and reboots, which a monotonic clock does not.
        self._buckets = SharedBuckets(path, SLOTS)
        self._now_ns = now_ns

    def admit(self, ctx: KeyContext) -> RateState | None:
        """Take one request from the key's requests bucket, or refuse with 429. None when the key's
        account sets no limits."""
        rpm, tpm = ctx.account.rpm_limit, ctx.account.tpm_limit
        if rpm is None and tpm is None:
            return None
        state = RateState(ctx.key.id, rpm, tpm)
        now = self._now_ns()
        if tpm is not None:
            state.remaining_tokens = self._buckets.available(_tokens(state), tpm, tpm, MINUTE_NS, now)
        if rpm is not None:
            taken = self._buckets.try_take(_requests(state), rpm, rpm, MINUTE_NS, 1, now)
            state.remaining_requests = taken.remaining
            if not taken.allowed:
                raise _refused(state, taken.retry_after_ns, f"{rpm} requests per minute")
        return state

    def reserve(self, state: RateState | None, tokens: int) -> None:
        """Reserve the request's estimated tokens, or refuse with 429 (the request it took is given
        back: it never ran)."""
        if state is None or state.tpm is None:
            return
        now = self._now_ns()
        taken = self._buckets.try_take(_tokens(state), state.tpm, state.tpm, MINUTE_NS, tokens, now)
        state.remaining_tokens = taken.remaining
        if not taken.allowed:
            if state.rpm is not None:
                state.remaining_requests = self._buckets.adjust(
                    _requests(state), state.rpm, state.rpm, MINUTE_NS, 1, now
                )
            what = f"{state.tpm} tokens per minute"
            if tokens > state.tpm:
                what += f"; this request may use up to {tokens} tokens: lower its max_tokens"
            raise _refused(state, taken.retry_after_ns, what)
        state.reserved_tokens = tokens

    def correct(self, state: RateState | None, used_tokens: int) -> None:
        """The request has ended having used `used_tokens`: give back the rest of its reservation
        (or take what it used beyond it). Once per request."""
        if state is None or state.tpm is None or state.corrected or not state.reserved_tokens:
            return
        state.corrected = True
        delta = state.reserved_tokens - used_tokens
        if delta:
            try:
                state.remaining_tokens = self._buckets.adjust(
                    _tokens(state), state.tpm, state.tpm, MINUTE_NS, delta, self._now_ns()
                )
            except OSError:  # the request is done and charged: a lost correction must not fail it
                log.exception("correcting the tokens of key %s failed", state.key_id)


def _requests(state: RateState) -> str:
    return state.key_id + ":requests"


def _tokens(state: RateState) -> str:
    return state.key_id + ":tokens"


def _refused(state: RateState, retry_after_ns: int, what: str) -> GatewayError:
    seconds = max(1, math.ceil(retry_after_ns / 1_000_000_000))
    return GatewayError(
        "rate_limited",
        f"Rate limit reached for this key: {what}. Retry after {seconds} s.",
        headers={**state.headers(), "retry-after": str(seconds)},
    )

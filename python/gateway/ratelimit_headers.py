"""The x-ratelimit-* headers on every answer to a key with limits (spec 8): the one place they are
made, added by the application's outermost middleware (gateway.edge), so that model requests, model
lists, usage lookups, job polls and downloads, unknown paths, errors and unexpected 500s all carry
them.

A model request shows what it took from its key's buckets (routes/common.py notes it in the
request's KeySlot). Any other answer shows the buckets as they stand, taking nothing: only model
requests count against a key's requests per minute (docs/behaviour.md, "Rate limits"). The key is
the one the route authenticated (gateway.auth notes it); when no route did (an unknown path, a
wrong method), the key presented is looked up here. No valid key, no headers: 401s carry none.
"""

from __future__ import annotations

import logging

from starlette.requests import Request
from starlette.types import Scope

from .auth import presented_context
from .ratelimits import KeySlot, RateLimiter, RateState
from .store import Store

log = logging.getLogger("gateway.ratelimits")
_LIMIT_HEADERS = (b"x-ratelimit-limit-requests", b"x-ratelimit-limit-tokens")


class RateLimitHeaders:
    """The x-ratelimit-* headers of an answer about to start."""

    def __init__(self, store: Store, limiter: RateLimiter) -> None:
        self._store = store
        self._limiter = limiter

    @staticmethod
    def none_for(slot: KeySlot) -> bool:
        """Whether the answer surely gets no headers: its key was found and sets no limits (the
        common case, decided without a lookup or an await)."""
        ctx = slot.ctx
        return (
            slot.rate is None
            and ctx is not None
            and ctx.account.rpm_limit is None
            and ctx.account.tpm_limit is None
        )

    async def add(self, scope: Scope, slot: KeySlot, headers: list[tuple[bytes, bytes]]) -> bool:
        """Append the key's headers to `headers` unless they carry them already (a 429 brings its
        own); whether any were added."""
        if any(name.lower() in _LIMIT_HEADERS for name, _ in headers):
            return False
        state = await self._state(scope, slot)
        if state is None:
            return False
        headers += [(k.encode(), v.encode()) for k, v in state.headers().items()]
        return True

    async def _state(self, scope: Scope, slot: KeySlot) -> RateState | None:
        if slot.rate is not None and slot.rate.unreachable:
            return None  # the buckets could not be reached for the request just now: none to show
        if slot.rate is not None:
            await self._limiter.corrected(slot.rate)  # a plain answer shows its corrected tokens
            try:
                await self._limiter.tokens_read(slot.rate)  # answered before it reserved any
            except OSError as exc:  # the buckets cannot be reached: the headers it has
                log.warning("reading the rate limits of key %s failed: %s", slot.rate.key_id, exc)
            return slot.rate
        ctx = slot.ctx
        # The answer matters more than its headers: no failure here may break it.
        if ctx is None and not slot.checked:  # no route looked at the key: look here
            try:
                ctx = await presented_context(Request(scope), self._store)
            except Exception:
                log.exception("looking up the key of %s failed", scope["path"])
                return None
        if ctx is None:
            return None
        try:
            return await self._limiter.peek(ctx)
        except OSError as exc:  # the buckets cannot be reached (Redis down): no headers
            log.warning("reading the rate limits of key %s failed: %s", ctx.key.id, exc)
            return None

"""Holds: the money a running request may still cost, set aside before it runs (spec 8: a request
that would take credits below zero is refused before it runs).

A request holds its estimated cost on its account's balance and, when its key has a credit limit,
on that limit too; both or neither. The hold is settled to the actual cost when the request ends,
or released unused when it fails.

Holds live in this process's memory, so the hot path touches no database. They are placed against
leases: money of a pot (an account's balance or a key's limit) that the store has set aside for this
process, atomically with every other process's leases, so that the leases of all processes never
exceed what the pot holds (gateway.store: lease). A hold that its lease cannot cover asks the store
for more; the store grants what the hold needs plus a 1/N part of what is left free, N being the
number of live lease owners (every worker process of every instance sharing the store:
Store.live_owners; at least this instance's worker count, so that the first worker to start does not
take it all while the others are still starting), so a single process leases the whole pot at once
and a request only waits on the database when a lease runs short. A charge takes its cost off the
lease (in memory at once, in the store with the settlement); idle leases go back after a while; a
dead process's leases go back when another reclaims them (SQLite: its journal replayed; PostgreSQL:
its heartbeat stopped), so no hold outlives its process for longer than that bound.

Exactness: requests are admitted exactly while the money lasts, within one process and across
processes and instances: near the end of a pot every lease is exactly what its hold needs
(store/leasing.py), so a request is refused only when the pot's money is held by running requests.
The leases of other processes are no exception: a process whose lease cannot be refilled recalls the
pot (Store.recall), and every process leasing it gives back what none of its holds uses at its next
housekeeping pass (answer_recalls, every second); the request waits for that, at most
RECALL_WAIT_SECONDS, and is refused only if the money that came back does not cover it either. That
covers a spare leased while the pot was plentiful (above all by a process that was alone then, such
as the first instance's before another started) and the rest a charge left of its hold below its
estimate. After a recall that brought nothing, the pot's next refusals in that process come at once
for RECALL_WAIT_SECONDS (a pot that is spent is not waited on by every request). This holds as long
as a request costs no more than its estimate; one that costs more (an upstream counting more prompt
tokens than the gateway, a Responses turn continuing an earlier one) is still charged in full, and
the balance can go below zero by that excess (then every request is refused).

A refusal says the most the request could cost and the money that was free for it (NotCovered): what
this process has of its lease that nothing holds, plus what no process has leased (after a recall,
that includes what the others gave back). For a text request billing adds the largest output limit
that money covers (NotCovered.explained).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Final

from . import clock
from .config import Prices
from .errors import ErrorCode, GatewayError
from .estimates import TextEstimate
from .pricing import Usage, cost, format_cost
from .store import KeyContext, Store

ZERO = Decimal(0)
# What a free request (estimated at zero) leases when its pot has nothing unheld: any money at all
# lets it run (spec 7.5.1 refuses free models only when nothing is left). The finest digit a charge
# keeps in practice (pricing: four significant figures of per-token prices); review: at a
# nano-dollar, a balance of $0.0000000005 refused every request.
SMALLEST = Decimal("1E-18")
# A lease untouched this long, with nothing held on it, goes back to its pot.
LEASE_IDLE_SECONDS = 2.0
# How long a request whose lease could not be refilled waits for the other processes to answer its
# recall (each does at its next housekeeping pass: gateway.housekeeping.LEASE_INTERVAL_SECONDS, 1 s),
# and how long after a recall that brought nothing the pot's refusals in this process come at once.
RECALL_WAIT_SECONDS = 2.5
# How often a waiting request looks whether money came back.
RECALL_POLL_SECONDS = 0.05


# What a client can do about each refusal.
_REMEDY: Final[Mapping[str, tuple[ErrorCode, str]]] = {
    "account": ("insufficient_credits", "Add credits and retry."),
    "key": ("key_budget_exceeded", "Raise the key's credit limit, wait for its reset, or use another key."),
}


# How many times a hold refused while the money it then finds covers it tries again (Funds.hold).
SECOND_LOOKS = 3


class NotCovered(GatewayError):
    """A hold refused (400 insufficient_credits for the account, key_budget_exceeded for the key's
    credit limit): the most the request could cost (`amount`) and the money that was free for it
    (`available`, on the pot that refused it; `usable`: the least of all its pots, what an output
    limit must fit; see the module's notes on several workers)."""

    def __init__(self, kind: str, amount: Decimal, available: Decimal, usable: Decimal | None = None) -> None:
        self.kind, self.amount, self.available = kind, amount, available
        self.usable = available if usable is None else min(usable, available)
        code, remedy = _REMEDY[kind]
        super().__init__(code, f"{self._situation()} {remedy}")

    def _situation(self) -> str:
        return f"This request may cost up to ${format_cost(self.amount)}; {self._what_is_available()}."

    def _what_is_available(self) -> str:
        where = "the account has" if self.kind == "account" else "this key's credit limit has"
        left = f"${format_cost(self.available)}" if self.available > 0 else "nothing"
        return f"{where} {left} available"

    def before_input(self) -> GatewayError:
        """The refusal of a large input's count (routes/text.count_input): the money left would not
        cover even its first token, so it is not counted at all."""
        code, remedy = _REMEDY[self.kind]
        return GatewayError(
            code, f"This request's input costs more than is left: {self._what_is_available()}. {remedy}"
        )

    def before_prompt(self) -> GatewayError:
        """The same refusal of a hold made before the request's prompt was counted (its output
        alone, `amount`): the prompt would only add to it."""
        code, remedy = _REMEDY[self.kind]
        return GatewayError(
            code,
            f"The output this request allows may cost up to ${format_cost(self.amount)} before its prompt"
            f" is counted; {self._what_is_available()}. {remedy}",
        )

    def explained(self, prices: Prices, estimate: Usage, forwarded: frozenset[str]) -> GatewayError:
        """The same refusal, saying for a text request the largest output limit the available money
        covers, as `param` (or that not even its prompt is covered, with no param)."""
        param = estimate.limit_param(forwarded) if isinstance(estimate, TextEstimate) else None
        if not isinstance(estimate, TextEstimate) or param is None or self.usable <= 0:
            return self
        code, remedy = _REMEDY[self.kind]
        remedy = remedy[0].lower() + remedy[1:]
        largest = largest_output(prices, estimate, self.usable)
        if largest < 1:
            prompt = cost(
                prices, replace(estimate, completion_tokens=0, reasoning_tokens=0, audio_completion_tokens=0)
            )
            message = (
                f"{self._situation()} That does not cover its prompt (${format_cost(prompt)}) with"
                f" any output: shorten it, or {remedy}"
            )
            return GatewayError(code, message)
        each = f" for each of its {estimate.choices} choices" if estimate.choices > 1 else ""
        if self.usable < self.available:  # the other pot has less left: the limit must fit that
            other = "this key's credit limit" if self.kind == "account" else "the account"
            each += f", within the ${format_cost(self.usable)} {other} has left"
        message = (
            f"{self._situation()} That covers {param} up to {largest}{each} (this request allows"
            f" {estimate.per_choice} output tokens{' each' if each else ''}): lower {param}, or {remedy}"
        )
        return GatewayError(code, message, param=param)


def largest_output(prices: Prices, estimate: TextEstimate, available: Decimal) -> int:
    """The largest output limit per choice (below what the request asked for) whose hold, as
    billing computes it, `available` covers; 0 when not even one token is."""

    def covered(per_choice: int) -> bool:
        output = per_choice * estimate.choices
        # As the hold prices it (the prompt's kinds as they are; the output at its dearest kind).
        amount = cost(
            prices,
            replace(
                estimate,
                completion_tokens=output,
                reasoning_tokens=output if estimate.reasoning_tokens else 0,
                audio_completion_tokens=output if estimate.audio_completion_tokens else 0,
            ),
        )
        return amount <= available and (amount > 0 or available > 0)

    # The cost never falls as the output grows (exact prices, then rounding): bisect.
    low, high = 0, estimate.per_choice - 1
    while low < high:
        middle = (low + high + 1) // 2
        if covered(middle):
            low = middle
        else:
            high = middle - 1
    return low if low >= 1 and covered(low) else 0


@dataclass(slots=True)
class Pot:
    """This process's lease on one pot and what its running requests hold of it."""

    kind: str
    pot_id: str
    lease: Decimal = ZERO
    held: Decimal = ZERO
    used_at: float = 0.0
    refilling: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Until then (monotonic), a refill the store refuses is not followed by a recall: the last one
    # brought nothing.
    futile_until: float = 0.0

    def covers(self, amount: Decimal) -> bool:
        free = self.lease - self.held
        return free >= amount and (amount > ZERO or free > ZERO)  # Decimal to Decimal: no conversion

    def shortfall(self, amount: Decimal) -> Decimal:
        """What a refill leases for `amount`, which this pot does not cover: the rest of it exactly
        (more would refuse a request the pot's last money covers), or SMALLEST for a free one."""
        return amount - (self.lease - self.held) if amount > ZERO else SMALLEST


@dataclass(slots=True)
class Hold:
    """Money set aside for one request; settled or released exactly once."""

    amount: Decimal
    pots: tuple[Pot, ...]
    open: bool = True


class Funds:
    def __init__(self, store: Store, workers: int = 1) -> None:
        self._store = store
        self._workers = workers  # this instance's worker processes: the least share a lease assumes
        self._epoch = 0  # the store's lease_epoch the pots below were leased under
        self._pots: dict[tuple[str, str], Pot] = {}
        self._returning: set[asyncio.Future[None]] = set()  # grants of cancelled refills going back
        self.open_holds = 0  # holds of this process's requests not yet released (for the metrics)

    async def hold(self, ctx: KeyContext, amount: Decimal, now_ms: int | None = None) -> Hold:
        """Set `amount` aside on the account and, if the key has a credit limit, on the key; or
        refuse with NotCovered (insufficient_credits / key_budget_exceeded) when either cannot
        cover it."""
        # Refills await the store, and meanwhile other requests may take what a refill brought and
        # idle pots may be given back: look again after each round; every round either holds,
        # refuses or leased more. A refusal whose own look at the money finds enough (holds let go
        # meanwhile) tries again, a few times, rather than say "may cost $X; $Y available", Y >= X.
        second_looks = SECOND_LOOKS
        while True:
            if self._store.lease_epoch != self._epoch:
                # This process was reclaimed as dead after a stall: the store took its leases back.
                # What it believed it leased is gone; holds from now on lease afresh.
                self._epoch = self._store.lease_epoch
                self._pots.clear()
            # Written out for one pot or two (no comprehension, no loop): every request holds.
            account = self._pot("account", ctx.account.id)
            key = None if ctx.key.credit_limit is None else self._pot("key", ctx.key.id)
            if not account.covers(amount):
                short = account
            elif key is not None and not key.covers(amount):
                short = key
            else:
                now = time.monotonic()
                account.held += amount
                account.used_at = now
                if key is not None:
                    key.held += amount
                    key.used_at = now
                self.open_holds += 1
                return Hold(amount, (account,) if key is None else (account, key))
            if not await self._refill(short, amount, now_ms):
                available = await self._available([account] if key is None else [account, key], now_ms)
                if second_looks > 0 and all(free >= amount for free in available.values()):
                    second_looks -= 1
                    continue
                refused = available.get(short.kind, ZERO)
                raise NotCovered(short.kind, amount, refused, min(available.values(), default=ZERO))

    async def _available(self, pots: list[Pot], now_ms: int | None) -> dict[str, Decimal]:
        """The money free for a request on each of these pots, by kind: what this process has of its
        lease that nothing holds, plus what no process has leased."""
        at = clock.now_ms() if now_ms is None else now_ms
        found = {}
        for pot in pots:
            unleased = await self._store.free(pot.kind, pot.pot_id, at)
            if unleased is not None:  # None: the key has no credit limit (any more)
                found[pot.kind] = max(ZERO, pot.lease - pot.held + unleased)
        return found

    async def _refill(self, pot: Pot, amount: Decimal, now_ms: int | None) -> bool:
        """Lease what `amount` needs on `pot`; False when the store has not that much free."""
        async with pot.refilling:
            if self._pots.get((pot.kind, pot.pot_id)) is not pot:
                return True  # given back while this request waited: the next round takes the new pot
            if pot.covers(amount):  # another request's refill brought enough
                return True
            need = pot.shortfall(amount)
            at = clock.now_ms() if now_ms is None else now_ms
            granted = await self._lease(pot, need, at)
            if granted.is_zero():
                granted = await self._recall(pot, need, at)
            if granted.is_zero():
                return False
            pot.lease += granted
            pot.used_at = time.monotonic()
            return True

    async def _recall(self, pot: Pot, need: Decimal, now_ms: int) -> Decimal:
        """After the store refused to lease `need`: recall the pot from the other processes and
        wait (at most RECALL_WAIT_SECONDS) until what they give back covers it. The grant, or zero
        when nothing came back that covers it (and then the pot's refusals come at once for a while)."""
        if time.monotonic() < pot.futile_until:
            return ZERO
        leased = await self._store.recall(pot.kind, pot.pot_id)
        deadline = time.monotonic() + RECALL_WAIT_SECONDS
        while leased > 0 and time.monotonic() < deadline:
            await asyncio.sleep(RECALL_POLL_SECONDS)
            # Pending first, free after: an answer gives back and clears its flag in one commit, so
            # "none pending" read first means the free read next already counts every answer.
            # The other order could read free before the last answer and "none pending" after it.
            pending = await self._store.recall_pending(pot.kind, pot.pot_id)
            free = await self._store.free(pot.kind, pot.pot_id, now_ms)
            if free is None or free >= need:
                granted = await self._lease(pot, need, now_ms)
                if granted > 0:
                    return granted
            elif not pending:
                break  # every process has answered: nothing more is coming
        pot.futile_until = time.monotonic() + RECALL_WAIT_SECONDS
        return ZERO

    async def _lease(self, pot: Pot, need: Decimal, now_ms: int) -> Decimal:
        """The store's grant of `need` (and a share of the rest) on `pot`. The store commits the
        grant whatever happens to this request; a request cancelled meanwhile (its client gone)
        must not lose it: it then goes back to the store."""
        leasing = asyncio.ensure_future(self._granted(pot, need, now_ms))
        try:
            return await asyncio.shield(leasing)
        except asyncio.CancelledError:
            leasing.add_done_callback(lambda done: self._give_back(pot, done))
            raise

    async def _granted(self, pot: Pot, need: Decimal, now_ms: int) -> Decimal:
        # The free rest is shared among the live owners (at least this instance's workers, some of
        # which may still be starting): one process alone leases it all.
        share = max(await self._store.live_owners(), self._workers)
        return await self._store.lease(pot.kind, pot.pot_id, need, share, now_ms)

    def _give_back(self, pot: Pot, leasing: asyncio.Future[Decimal]) -> None:
        if leasing.cancelled() or leasing.exception() is not None or leasing.result().is_zero():
            return
        self._returning.add(
            asyncio.ensure_future(self._store.return_lease(pot.kind, pot.pot_id, leasing.result()))
        )
        for task in list(self._returning):
            if task.done():
                self._returning.discard(task)

    def release(self, hold: Hold, charged: Decimal) -> None:
        """The request has ended and cost `charged` (zero when it is not billed): give the hold back
        and take the charge off the leases, as the settlement does in the store."""
        if not hold.open:
            return
        hold.open = False
        self.open_holds -= 1
        now = time.monotonic()
        for pot in hold.pots:
            pot.held -= hold.amount
            lease = pot.lease - charged
            pot.lease = lease if lease > ZERO else ZERO
            pot.used_at = now

    def money_held(self) -> Decimal:
        """What this process's open holds set aside, over every account (a key's pot holds the same
        money again: not counted twice)."""
        return sum((pot.held for pot in self._pots.values() if pot.kind == "account"), ZERO)

    async def answer_recalls(self) -> int:
        """Answer every recall of this process's leases (another process could not lease what its
        request needed): give back what no hold of this process uses. Returns how many were
        answered. Called at each housekeeping pass."""
        recalled = await self._store.recalls()
        for kind, pot_id in recalled:
            pot = self._pots.get((kind, pot_id))
            spare = ZERO
            # A pot this process has forgotten is on its way back already (return_idle), or was
            # taken back with every lease of a process reclaimed as dead: nothing to give here.
            if pot is not None and self._store.lease_epoch == self._epoch:
                spare = max(ZERO, pot.lease - pot.held)
                pot.lease -= spare
            try:
                await self._store.answer_recall(kind, pot_id, spare)
            except Exception:
                if pot is not None:
                    pot.lease += spare  # still this process's in the store: asked again next pass
                raise
        return len(recalled)

    async def return_idle(self, idle_seconds: float = LEASE_IDLE_SECONDS) -> int:
        """Give back every lease with nothing held on it and unused for `idle_seconds`; returns how
        many went back. Called now and again by housekeeping (at shutdown the store returns them
        all)."""
        cutoff = time.monotonic() - idle_seconds
        idle = [
            pot
            for pot in self._pots.values()
            if pot.held.is_zero() and pot.used_at <= cutoff and not pot.refilling.locked()
        ]
        for pot in idle:
            # Forgotten first: a request from now on starts a new pot and leases afresh.
            del self._pots[(pot.kind, pot.pot_id)]
        failed: Exception | None = None
        for pot in idle:
            if pot.lease <= 0:
                continue
            try:
                await self._store.return_lease(pot.kind, pot.pot_id, pot.lease)
            except Exception as exc:
                failed = exc
                self._keep(pot)
        if failed is not None:
            raise failed
        return len(idle)

    def _keep(self, pot: Pot) -> None:
        """A lease that could not be given back (the store out of reach) is still this process's in
        the store: it stays this process's here too, to be used or given back at a later pass.
        Forgotten, it would stay set aside in the store, held by nothing, until this process ends."""
        if self._store.lease_epoch != self._epoch:
            return  # this process was reclaimed meanwhile: the store took its leases back
        current = self._pots.get((pot.kind, pot.pot_id))
        if current is None:
            self._pots[(pot.kind, pot.pot_id)] = pot
        else:  # a request leased afresh meanwhile: the store's lease is the sum of both
            current.lease += pot.lease

    def _pot(self, kind: str, pot_id: str) -> Pot:
        pot = self._pots.get((kind, pot_id))
        if pot is None:
            pot = self._pots[(kind, pot_id)] = Pot(kind, pot_id, used_at=time.monotonic())
        return pot

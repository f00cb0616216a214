"""How much of a pot's free money a process is granted when it leases (gateway.funds): one rule for
every backend (the PostgreSQL store computes the same in its gateway_lease function; a test holds
the two together).

A process asks for what its hold needs. While the pot is plentiful it also gets a 1/share part of
the free rest (share: the live lease owners), so that it rarely has to ask again. Near the end of
the pot that spare is what would make exactness fail: money sitting unused in one process's lease
while another refuses a request. So a spare is granted only when that part would cover at least
SPARE_MIN_HOLDS more holds of this size; below that every lease is exactly what its hold needs, and
a request is refused only when the pot's money is all held by running requests.
"""

from __future__ import annotations

from decimal import ROUND_DOWN, Decimal

# What a lease of a key's limit was granted under: a change to either recalls every process's lease
# of it (Store.update_key), to be given back and leased again under the new terms.
KEY_TERMS = ("credit_limit", "limit_reset")
# A spare is granted only when it would cover this many more holds of the asking size.
SPARE_MIN_HOLDS = 16
# Grants are whole nano-dollars beyond what the hold needs.
LEASE_QUANTUM = Decimal("0.000000001")


def grant(free: Decimal, need: Decimal, share: int) -> Decimal:
    """What to lease to a process asking for `need` when the pot has `free` unleased money and
    `share` processes are alive: nothing when `need` does not fit."""
    if free < need:
        return Decimal(0)
    rest = free - need
    if share <= 1:
        return free  # alone: the whole pot, exactness holds within one process
    spare = (rest / share).quantize(LEASE_QUANTUM, ROUND_DOWN)
    return need + (spare if spare >= need * SPARE_MIN_HOLDS else Decimal(0))

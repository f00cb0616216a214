"""The conversation the gateway keeps for a chat model served on the Responses API.

A chat upstream keeps nothing, so the gateway keeps each translated response itself, as OpenAI keeps a
stored one (`store` not false): what the turn added to the conversation (its input, references
resolved, then its output items) and the Response object. A later turn may name it as
`previous_response_id` (the whole conversation then goes before the new input, instructions excepted,
as OpenAI does) or name its output items by `item_reference` (the AI SDK's `openai.responses(...)`
does, its `store` being true by default). A conversation is kept 30 days from its last turn.

Output item ids name their response: `msg_X`, `rs_X` and `fc_X_n` belong to `resp_X`
(gateway.translate.responses_answer), so the items a request names are found by response id, in one
read of the store.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import orjson

from ..clock import now_ms
from ..config import ModelConfig
from ..context import Call
from ..errors import GatewayError, invalid_request
from ..state import GatewayState
from ..store import KeptResponse

log = logging.getLogger("gateway.requests")

# How long a response can be continued, as OpenAI keeps stored responses (30 days): a kept response
# and a response state (where an upstream holds one) alike.
RESPONSE_TTL_MS = 30 * 24 * 3600 * 1000
# The prefixes of the output items a translated response makes (gateway.translate.responses_answer).
ITEM_PREFIXES = frozenset({"msg", "rs", "fc"})


@dataclass(frozen=True, slots=True)
class Turn:
    """A request to a chat model on the Responses API, with what the gateway keeps of it resolved.

    `payload` is the request as the translation to chat reads it: the whole conversation as `input`
    (earlier turns, then this one's items) and no previous_response_id. `items` is this turn's
    input, references resolved: what is kept of it, with the output, for the next turn."""

    payload: dict[str, Any]
    items: list[dict[str, Any]]
    previous_id: str | None


async def resolve(state: GatewayState, call: Call, payload: dict[str, Any]) -> Turn:
    """The request with its previous_response_id and item_references replaced by what they name.
    Either naming what this account has not kept (unknown, expired, another account's, made with
    `store: false`) is 400 `invalid_request`, as OpenAI answers. What they bring in together may be
    at most the request size limit (what a client could have sent itself), or 413."""
    given = payload.get("input")
    items: list[dict[str, Any]] = (
        [{"type": "message", "role": "user", "content": given}] if isinstance(given, str) else given or []
    )
    budget = state.settings.max_request_bytes
    resolved, brought = await _resolve_references(state, call, items, budget)
    previous = payload.get("previous_response_id")
    if previous is None:
        # Nothing named: the request goes as it came.
        return Turn(payload if resolved is items else {**payload, "input": resolved}, resolved, None)
    history = await _conversation(state, call, previous, budget - brought)
    expanded = {**payload, "input": history + resolved}
    del expanded["previous_response_id"]
    return Turn(expanded, resolved, previous)


async def keep(
    state: GatewayState, call: Call, model: ModelConfig, turn: Turn, response: dict[str, Any]
) -> None:
    """Keep a translated response (as its client saw it) for the turns that may follow it;
    committed when this returns. A store that fails is 503: the answer was not kept."""
    output = response.get("output")
    items = turn.items + (output if isinstance(output, list) else [])
    kept = KeptResponse(
        id=response["id"],
        account_id=call.ctx.account.id,
        model=model.name,
        previous_id=turn.previous_id,
        items=orjson.dumps(items),
        body=orjson.dumps(response),
        expires_at_ms=now_ms() + RESPONSE_TTL_MS,
    )
    try:
        await state.store.keep_response(kept)
    except GatewayError:
        raise  # the store's own 503 (PostgreSQL out of reach)
    except Exception as exc:
        log.exception("request %s: response %s could not be kept", call.request_id, kept.id)
        raise GatewayError(
            "service_unavailable", "The gateway could not keep the answer (`store` is true). Retry shortly."
        ) from exc


async def _conversation(state: GatewayState, call: Call, previous: str, budget: int) -> list[dict[str, Any]]:
    """Every item of the kept conversation that `previous` ends, oldest first; at most `budget`
    bytes of them."""
    account = call.ctx.account.id
    turns = await state.store.kept_conversation(previous, account, now_ms(), budget)
    if turns is None:
        held = await state.store.find_response(previous, account, now_ms())
        if held is not None:
            raise invalid_request(
                f"Response {previous!r} was made by {held.model!r}, whose upstream holds its state: a "
                f"chat model cannot continue it. Continue the conversation with {held.model!r}.",
                "previous_response_id",
            )
        raise invalid_request(f"Previous response with id {previous!r} not found.", "previous_response_id")
    if sum(len(items) for items in turns) > budget:
        raise _too_large(state, f"The conversation that {previous!r} ends", "previous_response_id")
    return [item for items in turns for item in orjson.loads(items)]


async def _resolve_references(
    state: GatewayState, call: Call, items: list[dict[str, Any]], budget: int
) -> tuple[list[dict[str, Any]], int]:
    """`items` with every item_reference replaced by the kept item it names (the same list when
    there is none), and the bytes the replacements brought in (at most `budget`)."""
    named: dict[int, str] = {}
    for i, item in enumerate(items):
        if item.get("type") == "item_reference":
            item_id = item.get("id")
            if not isinstance(item_id, str) or not item_id:
                raise invalid_request(f"`input[{i}].id` must be an item id.", f"input[{i}].id")
            named[i] = item_id
    if not named:
        return items, 0
    owners = {_owner(item_id) for item_id in named.values()}
    kept = await state.store.kept_items(
        sorted(o for o in owners if o is not None), call.ctx.account.id, now_ms()
    )
    found: dict[str, tuple[dict[str, Any], int]] = {}  # by item id: the item, and its size
    for response in kept.values():
        for item in orjson.loads(response):
            if isinstance(item, dict) and isinstance(item.get("id"), str) and item["id"] not in found:
                found[item["id"]] = (item, len(orjson.dumps(item)))
    resolved, brought = list(items), 0
    for i, item_id in named.items():
        if item_id not in found:
            raise invalid_request(f"Item with id {item_id!r} not found.", f"input[{i}]")
        resolved[i], size = found[item_id]
        brought += size
        if brought > budget:  # many references to one large item would multiply it
            raise _too_large(state, "The items that `input` references", "input")
    return resolved, brought


def _too_large(state: GatewayState, what: str, param: str) -> GatewayError:
    limit = state.settings.max_request_bytes
    return GatewayError(
        "request_too_large",
        f"{what} is larger than the gateway's limit of {limit} bytes for a request (what a request"
        " brings in from kept responses counts as sent). Start a new conversation, or send the part"
        " of it that matters as `input`.",
        param=param,
    )


def _owner(item_id: str) -> str | None:
    """The id of the translated response that made an output item (`fc_X_2` → `resp_X`), or None
    for an id the gateway did not make."""
    prefix, _, rest = item_id.partition("_")
    suffix = rest.partition("_")[0]
    return f"resp_{suffix}" if prefix in ITEM_PREFIXES and suffix else None

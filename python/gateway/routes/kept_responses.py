"""The conversation the gateway keeps for a chat model served on the Responses API.

A chat upstream keeps nothing, so the gateway keeps each translated response itself, as OpenAI keeps a
stored one (`store` not false): what the turn added to the conversation (its input, references
resolved, then its output items) and the Response object. A later turn may name it as
`previous_response_id` (the whole conversation then goes before the new input, instructions excepted,
as OpenAI does) or name its output items by `item_reference` (the AI SDK's `openai.responses(...)`
does, its `store` being true by default). A conversation is kept 30 days from its last turn, and so
is one whose items a later turn names.

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
from ..errors import GatewayError, invalid_request, quoted_id
from ..state import GatewayState
from ..store import ConversationGap, KeptResponse

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
    input, references resolved: what is kept of it, with the output, for the next turn. `brought`
    is the bytes the kept conversation and items added to the request (its prompt is that much
    larger than its body); `touches` the kept responses whose items it named."""

    payload: dict[str, Any]
    items: list[dict[str, Any]]
    previous_id: str | None
    brought: int = 0
    touches: tuple[str, ...] = ()


async def resolve(state: GatewayState, call: Call, payload: dict[str, Any]) -> Turn:
    """The request with its previous_response_id and item_references replaced by what they name.
    Either naming what this account has not kept (unknown, expired, another account's, made with
    `store: false`) is 400 `invalid_request`, as OpenAI answers, and so is an item named twice. What
    they bring in together may be at most the request size limit (what a client could have sent
    itself), or 413."""
    given = payload.get("input")
    items: list[dict[str, Any]] = (
        [{"type": "message", "role": "user", "content": given}] if isinstance(given, str) else given or []
    )
    budget = state.settings.max_request_bytes
    previous = payload.get("previous_response_id")
    history: list[dict[str, Any]] = []
    history_bytes = 0
    if previous is not None:
        history, history_bytes = await _conversation(state, call, previous, budget)
        items = _unrepeated_calls(history, items)
    named = _references(items)
    if not named:
        if previous is None:  # nothing named: the request goes as it came
            return Turn(payload, items, None)
        return Turn(_expanded(payload, history + items), items, previous, history_bytes)
    resolved, brought, touches = await _resolve(state, call, items, named, history, budget - history_bytes)
    return Turn(_expanded(payload, history + resolved), resolved, previous, history_bytes + brought, touches)


async def keep(
    state: GatewayState, call: Call, model: ModelConfig, turn: Turn, response: dict[str, Any]
) -> bool:
    """Keep a translated response (as its client saw it) for the turns that may follow it;
    committed when this returns True. A store that fails is logged, and the answer goes out
    unkept (False): the caller says `store: false` on it, as if the client had asked for that. The
    model's answer is charged either way, and never lost for want of a copy."""
    output = response.get("output")
    items = turn.items + (output if isinstance(output, list) else [])
    kept = KeptResponse(
        id=response["id"],
        account_id=call.ctx.account.id,
        model=model.name,
        previous_id=turn.previous_id,
        items=orjson.dumps(items),
        body=orjson.dumps({**response, "store": True}),
    )
    try:
        await state.store.keep_response(kept, now_ms() + RESPONSE_TTL_MS, turn.touches)
    except Exception:
        log.exception(
            "request %s: response %s could not be kept; answered with store false", call.request_id, kept.id
        )
        return False
    return True


async def refuse_kept_items(
    state: GatewayState, call: Call, model: ModelConfig, payload: dict[str, Any]
) -> None:
    """For a model whose upstream keeps its state (type responses): item_references naming items
    the gateway keeps for a chat model are out of that upstream's reach, 400 naming the model that
    said them. An item the gateway did not make is the upstream's own, and goes to it only when it
    is an output item of a response made for this account (remember_items): the upstream keeps
    every account's items under the gateway's one key, and would read another's (security
    review); any other is "not found", as OpenAI answers an item it does not have. So is a
    reasoning item sent back by its id alone (no `encrypted_content`), which OpenAI reads from
    what it stored."""
    given = payload.get("input")
    if not isinstance(given, list):
        return
    named = _references(given)
    looked_up = {**named, **_reasoning_by_id(given)}
    if not looked_up:
        return
    owners = {i: _owner(item_id) for i, item_id in named.items()}
    asked = sorted({owner for owner in owners.values() if owner is not None})
    kept = await state.store.kept_items(asked, call.ctx.account.id, now_ms()) if asked else {}
    if kept:
        first = min(i for i, owner in owners.items() if owner in kept)
        made = await state.store.find_kept_response(str(owners[first]), call.ctx.account.id, now_ms())
        raise _out_of_reach(model, f"input[{first}]", made)
    # No item named is one this account's chat models said: each is the upstream's (its ids can
    # look like the gateway's own, `msg_X`) and must be of one of this account's responses.
    known = await state.store.known_items(call.ctx.account.id, list(looked_up.values()), now_ms())
    for i, item_id in sorted(looked_up.items()):
        if item_id not in known:
            raise invalid_request(f"Item with id {quoted_id(item_id)} not found.", f"input[{i}]")


def _reasoning_by_id(items: list[Any]) -> dict[int, str]:
    """The ids of reasoning items sent back without their `encrypted_content`, by their place:
    OpenAI reads such an item from what it stored under that id (code review), as it does an
    item_reference's."""
    return {
        i: item["id"]
        for i, item in enumerate(items)
        if isinstance(item, dict)
        and item.get("type") == "reasoning"
        and isinstance(item.get("id"), str)
        and item["id"]
        and not item.get("encrypted_content")
    }


def output_item_ids(response: Any) -> list[str]:
    """The ids of a Responses object's output items (what a later turn's item_reference names)."""
    output = response.get("output") if isinstance(response, dict) else None
    if not isinstance(output, list):
        return []
    return [i["id"] for i in output if isinstance(i, dict) and isinstance(i.get("id"), str) and i["id"]]


async def remember_items(state: GatewayState, account_id: str, item_ids: list[str]) -> None:
    """Record the output items of a response an upstream keeps as this account's, for as long as
    the response is kept (refuse_kept_items lets an item_reference name them)."""
    if item_ids:
        await state.store.remember_items(account_id, item_ids, now_ms() + RESPONSE_TTL_MS)


async def previous_unknown(
    state: GatewayState, call: Call, model: ModelConfig, previous: str
) -> GatewayError:
    """The 400 for a previous_response_id that no upstream holds for a model of type responses: it
    names a chat model's kept response, or nothing this account has."""
    made = await state.store.find_kept_response(previous, call.ctx.account.id, now_ms())
    return (
        previous_not_found(previous) if made is None else _out_of_reach(model, "previous_response_id", made)
    )


def _out_of_reach(model: ModelConfig, param: str, made: KeptResponse | None) -> GatewayError:
    """`param` names a kept response (`made`, unless it expired meanwhile) of a chat model."""
    maker = made.model if made is not None else "a chat model"
    return invalid_request(
        f"`{param}` names what {maker!r} said, a chat model whose conversation the gateway keeps; "
        f"{model.name!r} has its conversation kept by its own upstream, which does not know it."
        " Continue with a chat model, or send the conversation's items themselves as `input`.",
        param,
    )


def previous_not_found(previous: str) -> GatewayError:
    return invalid_request(
        f"Previous response with id {quoted_id(previous)} not found.", "previous_response_id"
    )


def _unrepeated_calls(history: list[dict[str, Any]], items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`items` without the function_call items the kept conversation already holds (same call_id):
    the AI SDK, advancing previousResponseId at every step of a tool loop, sends the call again
    with its output, and a chat upstream refuses a tool call said twice before its result."""
    made = {item.get("call_id") for item in history if item.get("type") == "function_call"}
    return [
        item for item in items if not (item.get("type") == "function_call" and item.get("call_id") in made)
    ]


def _expanded(payload: dict[str, Any], conversation: list[dict[str, Any]]) -> dict[str, Any]:
    expanded = {**payload, "input": conversation}
    expanded.pop("previous_response_id", None)
    return expanded


async def _conversation(
    state: GatewayState, call: Call, previous: str, budget: int
) -> tuple[list[dict[str, Any]], int]:
    """Every item of the kept conversation that `previous` ends, oldest first, and their bytes (at
    most `budget`)."""
    account = call.ctx.account.id
    try:
        turns = await state.store.kept_conversation(previous, account, now_ms(), budget)
    except ConversationGap as gap:
        raise invalid_request(
            f"Response {quoted_id(previous)} continues response {quoted_id(gap.missing)}, which was"
            " deleted: this conversation can no longer be continued. Start a new one, or send the"
            " items that matter as `input`.",
            "previous_response_id",
        ) from None
    if turns is None:
        held = await state.store.find_response(previous, account, now_ms())
        if held is not None:
            raise invalid_request(
                f"Response {quoted_id(previous)} was made by {held.model!r}, whose upstream holds its state: "
                f"a chat model cannot continue it. Continue the conversation with {held.model!r}.",
                "previous_response_id",
            )
        raise previous_not_found(previous)
    size = sum(len(items) for items in turns)
    if size > budget:
        raise _too_large(state, f"The conversation that {quoted_id(previous)} ends", "previous_response_id")
    return [item for items in turns for item in orjson.loads(items)], size


def _references(items: list[dict[str, Any]]) -> dict[int, str]:
    """The item ids that item_reference items name, by their place in `items`."""
    named: dict[int, str] = {}
    for i, item in enumerate(items):
        if item.get("type") == "item_reference":
            item_id = item.get("id")
            if not isinstance(item_id, str) or not item_id:
                raise invalid_request(f"`input[{i}].id` must be an item id.", f"input[{i}].id")
            named[i] = item_id
    return named


async def _resolve(
    state: GatewayState,
    call: Call,
    items: list[dict[str, Any]],
    named: dict[int, str],
    history: list[dict[str, Any]],
    budget: int,
) -> tuple[list[dict[str, Any]], int, tuple[str, ...]]:
    """`items` with every item_reference replaced by the kept item it names, the bytes that brought
    in (at most `budget`), and the kept responses named. An item already in the conversation, or
    named twice, is 400 as OpenAI answers: it would be said twice."""
    owners = sorted({owner for owner in map(_owner, named.values()) if owner is not None})
    kept = await state.store.kept_items(owners, call.ctx.account.id, now_ms())
    found: dict[str, tuple[dict[str, Any], int]] = {}  # by item id: the item, and its size
    for response in kept.values():
        for item in orjson.loads(response):
            if isinstance(item, dict) and isinstance(item.get("id"), str) and item["id"] not in found:
                found[item["id"]] = (item, len(orjson.dumps(item)))
    said = {item["id"] for item in history if isinstance(item.get("id"), str)}
    resolved, brought = list(items), 0
    for i, item_id in named.items():
        if item_id not in found:
            raise invalid_request(f"Item with id {quoted_id(item_id)} not found.", f"input[{i}]")
        if item_id in said:
            raise invalid_request(f"Duplicate item found with id {quoted_id(item_id)}.", f"input[{i}]")
        said.add(item_id)
        resolved[i], size = found[item_id]
        brought += size
        if brought > budget:
            raise _too_large(state, "The items that `input` references", "input")
    return resolved, brought, tuple(sorted(kept))


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

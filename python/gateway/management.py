"""What the management API (/admin/v1, routes/admin.py) and the console (gateway.console) both do to
accounts, top-ups and keys, and how both show them: one code path, so a number or a rule is never
implemented twice.

Each operation takes the fields as given (decoded JSON, or a form's values put in the same shape),
reads them with gateway.admin_fields (400 invalid_request naming the field) and raises the same
GatewayError for the same mistake whoever called it. Money is a decimal string in every rendering.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from decimal import Decimal
from typing import Any, cast

from . import admin_fields as field
from . import budget
from .auth import display_prefix, generate_key, hash_key
from .clock import now_ms, rfc3339
from .errors import GatewayError, invalid_request, quoted_id
from .request_log import STREAM_SUMMARY
from .store import (
    Account,
    AccountChanges,
    Accounts,
    ApiKey,
    IdempotencyKeyReused,
    KeyChanges,
    NameTaken,
    RequestLog,
    TopUp,
)

STREAM_SUMMARY_PREFIX = b'{"object":"' + STREAM_SUMMARY.encode() + b'"'


def no_account(account_id: str, param: str | None = None) -> GatewayError:
    return GatewayError("not_found", f"No account {account_id!r}.", param=param)


async def account(store: Accounts, account_id: str, param: str | None = None) -> Account:
    """The account with this id; 404 `not_found` when there is none (naming `param`, a filter's
    query parameter, when it came from one)."""
    found = await store.get_account(account_id)
    if found is None:
        raise no_account(account_id, param)
    return found


def no_live_key(key_id: str) -> GatewayError:
    return GatewayError("not_found", f"No live key {key_id!r}.")


# ---------------------------------------------------------------- accounts


async def create_account(store: Accounts, configured: Collection[str], given: Mapping[str, Any]) -> Account:
    """A new account from its fields (name required; balance, allowed_models, rpm/tpm limits)."""
    fields = field.read_fields(
        given, {**field.account_fields(configured), "balance": field.money}, required=("name",)
    )
    name = fields.pop("name")
    balance = fields.pop("balance", Decimal(0))
    try:
        return await store.create_account(name, balance, **fields)
    except NameTaken as exc:
        raise invalid_request(f"An account named {name!r} exists already.", "name") from exc


async def update_account(
    store: Accounts, configured: Collection[str], account_id: str, given: Mapping[str, Any]
) -> Account:
    """The account after changing the given fields (a field left out stays as it is)."""
    changes = cast(AccountChanges, field.read_fields(given, field.account_fields(configured)))
    try:
        account = await store.update_account(account_id, changes)
    except NameTaken as exc:
        raise invalid_request(f"An account named {changes.get('name')!r} exists already.", "name") from exc
    if account is None:
        raise no_account(account_id)
    return account


# ---------------------------------------------------------------- top-ups


def top_up_fields(given: Mapping[str, Any]) -> dict[str, Any]:
    """A top-up's fields read: `amount` (required, positive) and `note`."""
    return field.read_fields(given, field.TOP_UP_FIELDS, required=("amount",))


async def top_up(
    store: Accounts, account_id: str, fields: Mapping[str, Any], idempotency_key: str | None = None
) -> tuple[TopUp, bool]:
    """Add money to the account's balance and ledger (`fields` as top_up_fields read them). With an
    idempotency key the account used already, the earlier top-up comes back and nothing is added:
    returns the top-up and whether it was that earlier one (a replay)."""
    try:
        done = await store.top_up(account_id, fields["amount"], fields.get("note"), idempotency_key)
    except IdempotencyKeyReused as exc:
        raise GatewayError(
            "idempotency_key_reused",
            "This Idempotency-Key was used for a top-up with another amount or note.",
        ) from exc
    if done is None:
        raise no_account(account_id)
    return done


# ---------------------------------------------------------------- keys


# The account's key the console's playground and compare run under (gateway.console.playground):
# the oldest live key of this name. Only the console gives a key this name, so that nobody holds
# its secret; the management API, the CLI and the console's own forms refuse it.
PLAYGROUND_KEY = "Console playground"


def refuse_reserved_name(name: object) -> None:
    """400 for a key named as the playground's (which would then be mistaken for it)."""
    if isinstance(name, str) and name.strip() == PLAYGROUND_KEY:
        raise invalid_request(
            f"The name {PLAYGROUND_KEY!r} is the console's own playground key's: choose another.", "name"
        )


def refuse_renaming(current: ApiKey | None, name: object) -> None:
    """400 for a key's new name that is the playground's, or for a new name of the playground's
    own key: renamed, the playground would make itself a new key without the credit limit or
    expiry its owner had set on this one (console review)."""
    if current is None or current.name != PLAYGROUND_KEY:
        refuse_reserved_name(name)
    elif not isinstance(name, str) or name.strip() != PLAYGROUND_KEY:
        raise invalid_request(
            f"The console's playground key keeps its name ({PLAYGROUND_KEY!r}): cap it with a credit"
            " limit or an expiry, or delete it.",
            "name",
        )


async def create_key(
    store: Accounts, account_id: str, given: Mapping[str, Any], *, playground: bool = False
) -> tuple[ApiKey, str]:
    """A new key of the account (name, credit_limit, limit_reset, expires_at) and its secret: the
    only time the secret exists outside the caller's hands, as only its hash is stored. Only the
    console's playground (`playground`) makes a key of its reserved name."""
    if not playground:
        refuse_reserved_name(given.get("name"))
    fields = field.read_fields(given, field.KEY_FIELDS)
    account = await store.get_account(account_id)
    if account is None:
        raise no_account(account_id)
    secret = generate_key()
    key = await store.create_key(
        account.id,
        fields.get("name", "default"),
        hash_key(secret),
        display_prefix(secret),
        fields.get("expires_at"),
        credit_limit=fields.get("credit_limit"),
        limit_reset=fields.get("limit_reset"),
    )
    return key, secret


async def _owned(store: Accounts, key_id: str, account_id: str | None) -> ApiKey | None:
    """With an account, the key must be one of its own: another account's key is unknown here.
    The key as it is, when it was read (always, with an account)."""
    if account_id is not None:
        key = await store.get_key(key_id)
        if key is None or key.account_id != account_id or key.deleted_at_ms is not None:
            raise no_live_key(key_id)
        return key
    return None


async def update_key(
    store: Accounts, key_id: str, given: Mapping[str, Any], *, account_id: str | None = None
) -> ApiKey:
    """The live key after changing the given fields (and only a key of `account_id` when given)."""
    fields = field.read_fields(given, field.KEY_FIELDS)
    if "expires_at" in fields:
        fields["expires_at_ms"] = fields.pop("expires_at")
    current = await _owned(store, key_id, account_id)
    if "name" in fields:
        refuse_renaming(current or await store.get_key(key_id), fields["name"])
    key = await store.update_key(key_id, cast(KeyChanges, fields))
    if key is None:
        raise no_live_key(key_id)
    return key


async def rotate_key(store: Accounts, key_id: str, *, account_id: str | None = None) -> tuple[ApiKey, str]:
    """A new secret for the live key (the old one stops working at once) and that secret."""
    await _owned(store, key_id, account_id)
    secret = generate_key()
    key = await store.rotate_key(key_id, hash_key(secret), display_prefix(secret))
    if key is None:
        raise no_live_key(key_id)
    return key, secret


async def delete_key(store: Accounts, key_id: str, *, account_id: str | None = None) -> ApiKey:
    """Delete the live key (it stops working at once); returns it as deleted."""
    await _owned(store, key_id, account_id)
    deleted = await store.delete_key(key_id)
    key = await store.get_key(key_id)
    if not deleted or key is None:
        raise no_live_key(key_id)
    return key


# ---------------------------------------------------------------- rendering (money as decimal strings)


def account_json(a: Account) -> dict[str, Any]:
    return {
        "id": a.id,
        "object": "account",
        "name": a.name,
        "balance": field.money_text(a.balance),
        "allowed_models": None if a.allowed_models is None else sorted(a.allowed_models),
        "rpm_limit": a.rpm_limit,
        "tpm_limit": a.tpm_limit,
        "created_at": rfc3339(a.created_at_ms),
    }


def key_json(k: ApiKey) -> dict[str, Any]:
    return {
        "id": k.id,
        "object": "api_key",
        "account_id": k.account_id,
        "name": k.name,
        "prefix": k.prefix,
        "credit_limit": None if k.credit_limit is None else field.money_text(k.credit_limit),
        "limit_reset": k.limit_reset,
        # What counts against credit_limit now (0 once a new period began).
        "spent": field.money_text(budget.spent_now(k, now_ms())),
        "expires_at": None if k.expires_at_ms is None else rfc3339(k.expires_at_ms),
        "created_at": rfc3339(k.created_at_ms),
        "deleted_at": None if k.deleted_at_ms is None else rfc3339(k.deleted_at_ms),
    }


def top_up_json(t: TopUp) -> dict[str, Any]:
    return {
        "id": t.id,
        "object": "top_up",
        "account_id": t.account_id,
        "amount": field.money_text(t.amount),
        "note": t.note,
        "balance_after": field.money_text(t.balance_after),
        "created_at": rfc3339(t.created_at_ms),
    }


async def known_cursor(
    cursor: str | None, page: Sequence[Any], param: str, what: str, exists: Callable[[str], Awaitable[bool]]
) -> None:
    """A page cursor (`after`, `before`: an entry's id) that names no entry is a mistake, not the end
    of the list: 400 naming it, rather than an empty page a client would take for the end. Only an
    empty page pays for the lookup."""
    if cursor is None or page or await exists(cursor):
        return
    raise invalid_request(
        f"`{param}` names no {what}: {quoted_id(cursor)}. Pass the id of an entry of the list.", param
    )


def found_by(get: Callable[[str], Awaitable[object | None]]) -> Callable[[str], Awaitable[bool]]:
    """Whether a store's getter (get_account, get_key...) finds an entry with that id."""

    async def found(entry_id: str) -> bool:
        return await get(entry_id) is not None

    return found


def log_json(e: RequestLog) -> dict[str, Any]:
    attempts: list[dict[str, Any]] = json.loads(e.attempts) if e.attempts else []
    return {
        "id": e.id,
        "object": "request_log",
        "key_id": e.key_id,
        "account_id": e.account_id,
        "method": e.method,
        "path": e.path,
        "model": e.model,
        "status": e.status,
        "error_code": e.error_code,
        "started_at": rfc3339(e.started_at_ms),
        "duration_ms": e.duration_ms,
        "cost": None if e.cost is None else field.money_text(e.cost),
        "usage_id": e.usage_id,
        "attempts": attempts,
        # The parameters the model does not take, dropped on the way to it (spec 1.3).
        "dropped_params": dropped_params(attempts),
        "request_bytes": e.request_bytes,
        "response_bytes": e.response_bytes,
    }


def dropped_params(attempts: list[dict[str, Any]]) -> list[str]:
    """The parameters dropped because the model does not take them (spec 1.3), as the request's
    attempts name them (gateway.request_log): the same for every try of the model."""
    names: set[str] = set()
    for attempt in attempts:
        dropped = attempt.get("dropped_params")
        if isinstance(dropped, list):
            names.update(str(n) for n in dropped)
    return sorted(names)


def log_with_bodies_json(e: RequestLog) -> dict[str, Any]:
    """One request log entry with its kept bodies (GET /admin/v1/logs/{id}, `gateway admin show-log`)."""
    return {
        **log_json(e),
        "request_body": body_json(e.request_body, e.request_bytes),
        "response_body": body_json(e.response_body, e.response_bytes),
    }


def body_json(data: bytes | None, size: int) -> dict[str, Any] | None:
    """A kept body (None once purged): as text when it is UTF-8 (JSON, SSE), else base64 (audio,
    images, multipart); `truncated` when only the first [logs] max_body_bytes were kept."""
    if data is None:
        return None
    try:
        encoding, text = "utf-8", data.decode()
    except UnicodeDecodeError:  # binary, or text cut inside a character
        encoding, text = "base64", base64.b64encode(data).decode()
    # A streamed text answer is kept as its summary, whole, not as a prefix of the events.
    summary = data.startswith(STREAM_SUMMARY_PREFIX)
    return {"encoding": encoding, "data": text, "truncated": not summary and size > len(data)}

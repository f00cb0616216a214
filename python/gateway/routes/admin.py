"""The management API under /admin/v1: accounts, top-ups, keys and request logs (docs/admin.md).

Used by a console and by scripts with the admin token, never with an API key (spec 5.6). Money is a
decimal string in both directions; a JSON number is read from its digits, never through a float.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable
from decimal import Decimal
from typing import Any, cast

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .. import admin_fields as field
from .. import budget, idempotency, request_log
from ..auth import admin_token, authenticate_admin, display_prefix, generate_key, hash_key
from ..clock import now_ms, rfc3339
from ..errors import GatewayError, invalid_request
from ..state import GatewayState
from ..store import (
    Account,
    AccountChanges,
    ApiKey,
    IdempotencyKeyReused,
    KeyChanges,
    NameTaken,
    RequestLog,
    TopUp,
)
from .common import json_response, read_body

# (status, payload) or (status, payload, headers)
Handler = Callable[[Request], Awaitable[tuple[Any, ...]]]
PREFIX = "/admin/v1"
STREAM_SUMMARY_PREFIX = b'{"object":"' + request_log.STREAM_SUMMARY.encode() + b'"'


def routes(state: GatewayState) -> list[Route]:
    store = state.store
    token = admin_token(state.settings)
    body_limit = state.settings.max_request_bytes
    account_fields = field.account_fields(frozenset(m.name for m in state.settings.models))

    def endpoint(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def run(request: Request) -> Response:
            authenticate_admin(request, token)  # before anything else, even a 404 for an id
            status, payload, *headers = await handler(request)
            return json_response(payload, status, headers[0] if headers else None)

        return run

    async def body(request: Request) -> dict[str, Any]:
        return _decode(await read_body(request, body_limit))

    async def account_of(request: Request) -> Account:
        account_id = request.path_params["account_id"]
        account = await store.get_account(account_id)
        if account is None:
            raise _no_account(account_id)
        return account

    # ---------------------------------------------------------------- accounts

    async def create_account(request: Request) -> tuple[int, Any]:
        fields = field.read_fields(
            await body(request), {**account_fields, "balance": field.money}, required=("name",)
        )
        name = fields.pop("name")
        balance = fields.pop("balance", Decimal(0))
        try:
            account = await store.create_account(name, balance, **fields)
        except NameTaken as exc:
            raise invalid_request(f"An account named {name!r} exists already.", "name") from exc
        return 201, account_json(account)

    async def list_accounts(request: Request) -> tuple[int, Any]:
        after, limit = _paging(request)
        return 200, _page(
            [account_json(a) for a in await store.list_accounts(after=after, limit=limit + 1)], limit
        )

    async def get_account(request: Request) -> tuple[int, Any]:
        return 200, account_json(await account_of(request))

    async def update_account(request: Request) -> tuple[int, Any]:
        changes = cast(AccountChanges, field.read_fields(await body(request), account_fields))
        account_id = request.path_params["account_id"]
        try:
            account = await store.update_account(account_id, changes)
        except NameTaken as exc:
            raise invalid_request(
                f"An account named {changes.get('name')!r} exists already.", "name"
            ) from exc
        if account is None:
            raise _no_account(account_id)
        return 200, account_json(account)

    # ---------------------------------------------------------------- top-ups

    async def top_up(request: Request) -> tuple[Any, ...]:
        fields = field.read_fields(await body(request), field.TOP_UP_FIELDS, required=("amount",))
        account_id = request.path_params["account_id"]
        key = idempotency.requested_key(request)
        try:
            done = await store.top_up(account_id, fields["amount"], fields.get("note"), key)
        except IdempotencyKeyReused as exc:
            raise GatewayError(
                "idempotency_key_reused",
                "This Idempotency-Key was used for a top-up with another amount or note.",
            ) from exc
        if done is None:
            raise _no_account(account_id)
        entry, replayed = done
        if replayed:  # answered as the first time, adding nothing (spec 8's header, as Stripe does)
            return 201, top_up_json(entry), {"Idempotency-Replayed": "true"}
        return 201, top_up_json(entry)

    async def list_top_ups(request: Request) -> tuple[int, Any]:
        account = await account_of(request)
        after, limit = _paging(request)
        entries = await store.list_top_ups(account.id, after=after, limit=limit + 1)
        return 200, _page([top_up_json(t) for t in entries], limit)

    # ---------------------------------------------------------------- keys

    async def create_key(request: Request) -> tuple[int, Any]:
        fields = field.read_fields(await body(request), field.KEY_FIELDS)
        account = await account_of(request)
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
        return 201, {**key_json(key), "key": secret}

    async def list_keys(request: Request) -> tuple[int, Any]:
        account = await account_of(request)
        after, limit = _paging(request)
        keys = await store.list_keys(account.id, after=after, limit=limit + 1)
        return 200, _page([key_json(k) for k in keys], limit)

    async def get_key(request: Request) -> tuple[int, Any]:
        key = await store.get_key(request.path_params["key_id"])
        if key is None:
            raise GatewayError("not_found", f"No key {request.path_params['key_id']!r}.")
        return 200, key_json(key)

    async def update_key(request: Request) -> tuple[int, Any]:
        fields = field.read_fields(await body(request), field.KEY_FIELDS)
        if "expires_at" in fields:
            fields["expires_at_ms"] = fields.pop("expires_at")
        key = await store.update_key(request.path_params["key_id"], cast(KeyChanges, fields))
        if key is None:
            raise _no_live_key(request.path_params["key_id"])
        return 200, key_json(key)

    async def rotate_key(request: Request) -> tuple[int, Any]:
        secret = generate_key()
        key = await store.rotate_key(request.path_params["key_id"], hash_key(secret), display_prefix(secret))
        if key is None:
            raise _no_live_key(request.path_params["key_id"])
        return 200, {**key_json(key), "key": secret}

    async def delete_key(request: Request) -> tuple[int, Any]:
        key_id = request.path_params["key_id"]
        deleted = await store.delete_key(key_id)
        key = await store.get_key(key_id)
        if not deleted or key is None:
            raise _no_live_key(key_id)
        return 200, key_json(key)

    # ---------------------------------------------------------------- request logs

    async def list_logs(request: Request) -> tuple[int, Any]:
        query = request.query_params
        limit = field.page_size(query.get("limit"), "limit")
        entries = await store.list_request_logs(
            account_id=query.get("account_id"),
            key_id=query.get("key_id"),
            before=query.get("before"),
            limit=limit + 1,  # one more tells whether another page follows
        )
        page = [log_json(e) for e in entries[:limit]]
        return 200, {**_list(page), "has_more": len(entries) > limit}

    async def get_log(request: Request) -> tuple[int, Any]:
        entry = await store.get_request_log(request.path_params["log_id"])
        if entry is None:
            raise GatewayError("not_found", f"No request log {request.path_params['log_id']!r}.")
        return 200, log_with_bodies_json(entry)

    # ---------------------------------------------------------------- channels

    async def list_channels(request: Request) -> tuple[int, Any]:
        """Each model's channels and their health (gateway.routing): with Redis, the breakers, caps
        and requests in flight of every instance; without it, as the worker answering sees it."""
        health = await state.router.report()
        models = [
            {"object": "model_channels", "model": name, "channels": channels}
            for name, channels in health.items()
        ]
        return 200, _list(models)

    return [
        Route(f"{PREFIX}/channels", endpoint(list_channels), methods=["GET"]),
        Route(f"{PREFIX}/logs", endpoint(list_logs), methods=["GET"]),
        Route(f"{PREFIX}/logs/{{log_id}}", endpoint(get_log), methods=["GET"]),
        Route(f"{PREFIX}/accounts", endpoint(create_account), methods=["POST"]),
        Route(f"{PREFIX}/accounts", endpoint(list_accounts), methods=["GET"]),
        Route(f"{PREFIX}/accounts/{{account_id}}", endpoint(get_account), methods=["GET"]),
        Route(f"{PREFIX}/accounts/{{account_id}}", endpoint(update_account), methods=["PATCH"]),
        Route(f"{PREFIX}/accounts/{{account_id}}/top-ups", endpoint(top_up), methods=["POST"]),
        Route(f"{PREFIX}/accounts/{{account_id}}/top-ups", endpoint(list_top_ups), methods=["GET"]),
        Route(f"{PREFIX}/accounts/{{account_id}}/keys", endpoint(create_key), methods=["POST"]),
        Route(f"{PREFIX}/accounts/{{account_id}}/keys", endpoint(list_keys), methods=["GET"]),
        Route(f"{PREFIX}/keys/{{key_id}}", endpoint(get_key), methods=["GET"]),
        Route(f"{PREFIX}/keys/{{key_id}}", endpoint(update_key), methods=["PATCH"]),
        Route(f"{PREFIX}/keys/{{key_id}}", endpoint(delete_key), methods=["DELETE"]),
        Route(f"{PREFIX}/keys/{{key_id}}/rotate", endpoint(rotate_key), methods=["POST"]),
    ]


def _no_account(account_id: str) -> GatewayError:
    return GatewayError("not_found", f"No account {account_id!r}.")


def _no_live_key(key_id: str) -> GatewayError:
    return GatewayError("not_found", f"No live key {key_id!r}.")


# ---------------------------------------------------------------- reading requests


def _decode(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object ({} when empty). Numbers with a fraction or exponent become Decimal
    from their own digits, so "amount": 0.1 is exactly 0.1; NaN and Infinity are refused."""
    if not raw.strip():
        return {}
    try:
        payload = json.loads(raw, parse_float=Decimal, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise invalid_request(f"The request body is not valid JSON: {exc}.") from None
    if not isinstance(payload, dict):
        raise invalid_request("The request body must be a JSON object.")
    return payload


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number")


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


def log_json(e: RequestLog) -> dict[str, Any]:
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
        "attempts": json.loads(e.attempts) if e.attempts else [],
        "request_bytes": e.request_bytes,
        "response_bytes": e.response_bytes,
    }


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


def _paging(request: Request) -> tuple[str | None, int]:
    """`after` (the id of the last entry of the previous page) and `limit` of a list request."""
    return request.query_params.get("after"), field.page_size(request.query_params.get("limit"), "limit")


def _page(data: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    """A page of a list asked for with limit + 1 entries: the extra one only tells that more follow."""
    return {**_list(data[:limit]), "has_more": len(data) > limit}


def _list(data: list[dict[str, Any]]) -> dict[str, Any]:
    return {"object": "list", "data": data}

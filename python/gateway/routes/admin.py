"""The management API under /admin/v1: accounts, top-ups, keys and request logs (docs/admin.md),
described for tools by GET /admin/v1/openapi.json (routes/admin_openapi.py).

Used by a console and by scripts with the admin token, never with an API key (spec 5.6). Money is a
decimal string in both directions; a JSON number is read from its digits, never through a float.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from decimal import Decimal
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .. import admin_fields as field
from .. import idempotency, management
from ..auth import admin_token, authenticate_admin
from ..config import Settings
from ..errors import GatewayError, invalid_request
from ..management import (  # the renderers live with the operations; imported from here too
    account_json,
    body_json,
    key_json,
    log_json,
    log_with_bodies_json,
    top_up_json,
)
from ..state import GatewayState
from ..store import Account
from .admin_openapi import document_json
from .common import json_response, list_query, read_body

__all__ = [
    "PREFIX",
    "account_json",
    "body_json",
    "key_json",
    "log_json",
    "log_with_bodies_json",
    "routes",
    "top_up_json",
]

# (status, payload) or (status, payload, headers)
Handler = Callable[[Request], Awaitable[tuple[Any, ...]]]
PREFIX = "/admin/v1"


def routes(state: GatewayState) -> list[Route]:
    store = state.store
    token = admin_token(state.settings)
    configured = frozenset(m.name for m in state.settings.models)

    def endpoint(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def run(request: Request) -> Response:
            authenticate_admin(request, token)  # before anything else, even a 404 for an id
            status, payload, *headers = await handler(request)
            return json_response(payload, status, headers[0] if headers else None)

        return run

    async def body(request: Request) -> dict[str, Any]:
        return object_body(await admin_body(request, state.settings))

    async def account_of(request: Request) -> Account:
        return await management.account(store, request.path_params["account_id"])

    # ---------------------------------------------------------------- accounts

    async def create_account(request: Request) -> tuple[int, Any]:
        return 201, account_json(await management.create_account(store, configured, await body(request)))

    async def list_accounts(request: Request) -> tuple[int, Any]:
        after, limit = _paging(request)
        accounts = await store.list_accounts(after=after, limit=limit + 1)
        await management.known_cursor(
            after, accounts, "after", "account", management.found_by(store.get_account)
        )
        return 200, _page([account_json(a) for a in accounts], limit)

    async def get_account(request: Request) -> tuple[int, Any]:
        return 200, account_json(await account_of(request))

    async def update_account(request: Request) -> tuple[int, Any]:
        account_id = request.path_params["account_id"]
        account = await management.update_account(store, configured, account_id, await body(request))
        return 200, account_json(account)

    # ---------------------------------------------------------------- top-ups

    async def top_up(request: Request) -> tuple[Any, ...]:
        fields = management.top_up_fields(await body(request))
        key = idempotency.requested_key(request)
        entry, replayed = await management.top_up(store, request.path_params["account_id"], fields, key)
        if replayed:  # answered as the first time, adding nothing (spec 8's header, as Stripe does)
            return 201, top_up_json(entry), {"Idempotency-Replayed": "true"}
        return 201, top_up_json(entry)

    async def list_top_ups(request: Request) -> tuple[int, Any]:
        account = await account_of(request)
        after, limit = _paging(request)
        entries = await store.list_top_ups(account.id, after=after, limit=limit + 1)

        async def top_up_exists(top_up_id: str) -> bool:
            return any(t.id == top_up_id for t in await store.list_top_ups(account.id))

        await management.known_cursor(after, entries, "after", "top-up of this account", top_up_exists)
        return 200, _page([top_up_json(t) for t in entries], limit)

    # ---------------------------------------------------------------- keys

    async def create_key(request: Request) -> tuple[int, Any]:
        key, secret = await management.create_key(
            store, request.path_params["account_id"], await body(request)
        )
        return 201, {**key_json(key), "key": secret}

    async def list_keys(request: Request) -> tuple[int, Any]:
        account = await account_of(request)
        after, limit = _paging(request)
        keys = await store.list_keys(account.id, after=after, limit=limit + 1)
        await management.known_cursor(after, keys, "after", "key", management.found_by(store.get_key))
        return 200, _page([key_json(k) for k in keys], limit)

    async def get_key(request: Request) -> tuple[int, Any]:
        key = await store.get_key(request.path_params["key_id"])
        if key is None:
            raise GatewayError("not_found", f"No key {request.path_params['key_id']!r}.")
        return 200, key_json(key)

    async def update_key(request: Request) -> tuple[int, Any]:
        return 200, key_json(
            await management.update_key(store, request.path_params["key_id"], await body(request))
        )

    async def rotate_key(request: Request) -> tuple[int, Any]:
        no_fields(await admin_body(request, state.settings))
        key, secret = await management.rotate_key(store, request.path_params["key_id"])
        return 200, {**key_json(key), "key": secret}

    async def delete_key(request: Request) -> tuple[int, Any]:
        no_fields(await admin_body(request, state.settings))
        return 200, key_json(await management.delete_key(store, request.path_params["key_id"]))

    # ---------------------------------------------------------------- request logs

    async def list_logs(request: Request) -> tuple[int, Any]:
        query = list_query(request, ("account_id", "key_id", "before", "limit"))
        limit = field.page_size(query.get("limit"), "limit")
        # A filter that names nothing is a mistake: an empty page would look like "no requests".
        if query.get("account_id") is not None:
            await management.account(store, query["account_id"], param="account_id")
        if query.get("key_id") is not None and await store.get_key(query["key_id"]) is None:
            raise GatewayError("not_found", f"No key {query['key_id']!r}.", param="key_id")
        entries = await store.list_request_logs(
            account_id=query.get("account_id"),
            key_id=query.get("key_id"),
            before=query.get("before"),
            limit=limit + 1,  # one more tells whether another page follows
        )
        before = query.get("before")
        await management.known_cursor(
            before, entries, "before", "request log", management.found_by(store.get_request_log)
        )
        page = [log_json(e) for e in entries[:limit]]
        return 200, {**_list(page), "has_more": len(entries) > limit}

    async def get_log(request: Request) -> tuple[int, Any]:
        entry = await store.get_request_log(request.path_params["log_id"])
        if entry is None:
            raise GatewayError("not_found", f"No request log {request.path_params['log_id']!r}.")
        return 200, log_with_bodies_json(entry)

    # ---------------------------------------------------------------- the API's own description

    document = document_json(configured)  # built and encoded once (routes/admin_openapi.py)

    async def openapi(request: Request) -> Response:
        authenticate_admin(request, token)  # part of the management API: its token, or its 403 when off
        return Response(document, media_type="application/json")

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
        Route(f"{PREFIX}/openapi.json", openapi, methods=["GET"]),
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


# ---------------------------------------------------------------- reading requests


async def admin_body(request: Request, settings: Settings) -> bytes:
    """A management request's body, read within the request size limit and the body's idle time."""
    return await read_body(request, settings.max_request_bytes, settings.body_idle_timeout_seconds)


def object_body(raw: bytes) -> dict[str, Any]:
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
    try:  # json takes "\ud800" escapes that no UTF-8 text (the store, an answer) can hold
        json.dumps(payload, ensure_ascii=False, default=str).encode()
    except UnicodeEncodeError:
        raise invalid_request(
            "The request body is not valid JSON: a string holds a lone surrogate escape (\\ud800-\\udfff)."
        ) from None
    return payload


def no_fields(raw: bytes) -> None:
    """The body of an endpoint that takes no field: empty, or a JSON object without one. A field
    given is refused as every admin endpoint refuses an unknown one, so that a caller who thinks it
    set something (a limit on a rotated key) learns that it did not (fuzz review)."""
    given = object_body(raw)
    if given:
        first = sorted(given)[0]
        raise invalid_request(f"Unknown field `{first}`: this endpoint takes none.", first)


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number")


def _paging(request: Request) -> tuple[str | None, int]:
    """`after` (the id of the last entry of the previous page) and `limit` of a list request."""
    query = list_query(request, ("after", "limit"))
    return query.get("after"), field.page_size(query.get("limit"), "limit")


def _page(data: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    """A page of a list asked for with limit + 1 entries: the extra one only tells that more follow."""
    return {**_list(data[:limit]), "has_more": len(data) > limit}


def _list(data: list[dict[str, Any]]) -> dict[str, Any]:
    return {"object": "list", "data": data}

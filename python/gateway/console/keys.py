"""An account's API keys (docs/console.md; spec 5.6: keys are managed here, never with a key):
list, create (the secret shown once), edit the name, credit limit, its reset and the expiry,
rotate (a new secret shown once), delete. Every change goes through gateway.management, the
operations of the management API, scoped to the account: another account's key is not found.

Its forms are read within bounds and carry one-time tokens (gateway.console.forms).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from .. import admin_fields as field
from .. import budget, management
from ..clock import now_ms, rfc3339
from ..errors import GatewayError
from ..store import LIMIT_RESETS, Account, ApiKey
from .endpoints import Console, Endpoint
from .forms import ONCE, bounded_body, form_of, once_token
from .render import page
from .security import Viewer

# The last moment of an expiry date: a key set to expire on a day works through that day (UTC).
END_OF_DAY: Final = "T23:59:59.999Z"


# ---------------------------------------------------------------- keys


def key_fields(form: FormData) -> dict[str, Any]:
    """The key form as management.create_key / update_key take it (the management API's fields):
    a blank credit limit, reset "none" or a blank expiry clear them."""
    given: dict[str, Any] = {}
    name = form.get("name")
    if isinstance(name, str):
        given["name"] = name.strip()
    limit = form.get("credit_limit")
    if isinstance(limit, str):
        given["credit_limit"] = limit.strip().removeprefix("$").strip() or None
    reset = form.get("limit_reset")
    if isinstance(reset, str):
        given["limit_reset"] = None if reset in ("", "none") else reset
    expires = form.get("expires_at")
    if isinstance(expires, str):
        expires = expires.strip()
        # A date (the form's date input) expires at the end of that day, UTC; a full time as given.
        given["expires_at"] = (
            None if not expires else expires + END_OF_DAY if len(expires) == len("2026-12-31") else expires
        )
    return given


def key_view(key: ApiKey, now: int) -> dict[str, Any]:
    """A key as the Keys page lists it."""
    if key.deleted_at_ms is not None:
        state = "deleted"
    elif key.expires_at_ms is not None and key.expires_at_ms <= now:
        state = "expired"
    else:
        state = "active"
    spent = budget.spent_now(key, now)  # counted only for a key with a credit limit
    return {
        "id": key.id,
        "name": key.name,
        "prefix": key.prefix,
        "created_at_ms": key.created_at_ms,
        "deleted_at_ms": key.deleted_at_ms,
        "expires_at_ms": key.expires_at_ms,
        "credit_limit": key.credit_limit,
        "credit_limit_text": "" if key.credit_limit is None else field.money_text(key.credit_limit),
        "limit_reset": key.limit_reset,
        "spent": spent,
        "state": state,
        "live": state != "deleted",
    }


def routes(console: Console) -> list[BaseRoute]:
    state = console.state
    store = state.store

    def allowed_models(account: Account) -> list[str]:
        configured = sorted(m.name for m in state.settings.models)
        return configured if account.allowed_models is None else sorted(account.allowed_models)

    async def own_key(account: Account, key_id: str) -> ApiKey:
        key = await store.get_key(key_id)
        if key is None or key.account_id != account.id:  # another account's key: as unknown
            raise GatewayError("not_found", f"No key {key_id!r}.")
        return key

    async def keys_page(
        request: Request,
        viewer: Viewer,
        account: Account,
        *,
        status: int = 200,
        error: str | None = None,
        given: Mapping[str, Any] | None = None,
    ) -> Response:
        now = now_ms()
        keys = [key_view(k, now) for k in await store.list_keys(account.id)]
        return page(
            request,
            "keys.html",
            viewer,
            status=status,
            account=account,
            keys=[k for k in keys if k["live"]],
            deleted=[k for k in keys if not k["live"]],
            allowed_models=allowed_models(account),
            all_models=account.allowed_models is None,
            resets=LIMIT_RESETS,
            error=error,
            given=given or {},
            once=ONCE.new,
        )

    async def list_keys(request: Request, viewer: Viewer) -> Response:
        return await keys_page(request, viewer, await console.account_of(request, viewer))

    async def create_key(request: Request, viewer: Viewer) -> Response:
        account = await console.account_of(request, viewer)
        form = await form_of(request)
        given = key_fields(form)
        if not given.get("name"):
            given["name"] = "default"
        token = once_token(form)
        if not ONCE.claim(viewer.session.id, token):  # this very form again: a refresh
            return _done_page(request, viewer, account, None, rotated=False)
        try:
            key, secret = await management.create_key(store, account.id, given)
        except GatewayError as err:
            ONCE.release(viewer.session.id, token)
            if err.status >= 500 or err.status == 404:
                raise
            return await keys_page(request, viewer, account, status=err.status, error=err.message, given=form)
        return _secret_page(request, viewer, account, key, secret, rotated=False)

    async def edit_form(request: Request, viewer: Viewer) -> Response:
        account = await console.account_of(request, viewer)
        key = await own_key(account, request.path_params["key_id"])
        return _edit_page(request, viewer, account, key)

    def _edit_page(
        request: Request,
        viewer: Viewer,
        account: Account,
        key: ApiKey,
        *,
        status: int = 200,
        error: str | None = None,
    ) -> Response:
        view = key_view(key, now_ms())
        expires = "" if key.expires_at_ms is None else _date(key.expires_at_ms)
        return page(
            request,
            "keys_edit.html",
            viewer,
            status=status,
            account=account,
            key=view,
            expires=expires,
            resets=LIMIT_RESETS,
            error=error,
            once=ONCE.new,
        )

    async def update_key(request: Request, viewer: Viewer) -> Response:
        account = await console.account_of(request, viewer)
        key = await own_key(account, request.path_params["key_id"])
        form = await form_of(request)
        given = key_fields(form)
        expires = form.get("expires_at")
        if (
            key.expires_at_ms is not None
            and isinstance(expires, str)
            and expires.strip() == _date(key.expires_at_ms)
        ):
            # The date the form showed, unchanged: the expiry stays as it is, to the millisecond (a
            # date input cannot say the time, and the end of that day would revive a key expired
            # earlier today).
            given.pop("expires_at", None)
        try:
            await management.update_key(store, key.id, given, account_id=account.id)
        except GatewayError as err:
            if err.status >= 500 or err.status == 404:
                raise
            return _edit_page(request, viewer, account, key, status=err.status, error=err.message)
        return RedirectResponse(f"/console/a/{account.id}/keys", status_code=303)

    async def rotate_key(request: Request, viewer: Viewer) -> Response:
        account = await console.account_of(request, viewer)
        key = await own_key(account, request.path_params["key_id"])
        token = once_token(await form_of(request))
        if not ONCE.claim(viewer.session.id, token):  # this very form again: a refresh
            return _done_page(request, viewer, account, key, rotated=True)
        try:
            rotated, secret = await management.rotate_key(store, key.id, account_id=account.id)
        except GatewayError:
            ONCE.release(viewer.session.id, token)
            raise
        return _secret_page(request, viewer, account, rotated, secret, rotated=True)

    async def delete_key(request: Request, viewer: Viewer) -> Response:
        account = await console.account_of(request, viewer)
        key = await own_key(account, request.path_params["key_id"])
        await management.delete_key(store, key.id, account_id=account.id)
        return RedirectResponse(f"/console/a/{account.id}/keys", status_code=303)

    def form(handler: Any) -> Endpoint:
        return bounded_body(console.page(handler))

    return [
        Route("/a/{account_id}/keys", console.page(list_keys), methods=["GET"]),
        Route("/a/{account_id}/keys", form(create_key), methods=["POST"]),
        Route("/a/{account_id}/keys/{key_id}", console.page(edit_form), methods=["GET"]),
        Route("/a/{account_id}/keys/{key_id}", form(update_key), methods=["POST"]),
        Route("/a/{account_id}/keys/{key_id}/rotate", form(rotate_key), methods=["POST"]),
        Route("/a/{account_id}/keys/{key_id}/delete", form(delete_key), methods=["POST"]),
    ]


def _date(ms: int) -> str:
    """The UTC date of a moment, as a date input shows it."""
    return rfc3339(ms)[:10]


def _secret_page(
    request: Request, viewer: Viewer, account: Account, key: ApiKey, secret: str, *, rotated: bool
) -> Response:
    """The one time a secret is shown: rendered straight from the POST (never stored, never in a
    URL); the page is not cached (the console's cache-control: no-store)."""
    return page(
        request,
        "key_secret.html",
        viewer,
        account=account,
        key=key_view(key, now_ms()),
        secret=secret,
        rotated=rotated,
    )


def _done_page(
    request: Request, viewer: Viewer, account: Account, key: ApiKey | None, *, rotated: bool
) -> Response:
    """A form that showed a secret, sent again (a refresh): it was done once, and the secret,
    shown then, is not shown again."""
    return page(
        request,
        "key_secret.html",
        viewer,
        account=account,
        key=None if key is None else key_view(key, now_ms()),
        secret=None,
        rotated=rotated,
    )

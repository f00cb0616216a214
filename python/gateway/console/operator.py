"""The operator view (docs/console.md): every account (create; allowed models and rate limits; top
up), the console users (create with an invitation link shown once, a new invitation, delete) and
channel health. Operators only: a member gets 404, as for a page that does not exist.

Every change goes through the operation the management API runs (gateway.management for accounts
and top-ups, routes/console_users for console users): a form's values are put in the shape of the
API's JSON fields and read by the same checks, so the console refuses what the API refuses.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from .. import management
from ..errors import GatewayError
from ..routes import console_users
from ..store import Account
from .endpoints import Console
from .forms import MAX_FORM_FIELDS, ONCE, bounded_body, form_of, once_token
from .render import page
from .security import Viewer

BASE = "/console/operator"
# A number typed in a form is read as one only when it is plain ASCII digits of at most this many
# (more than any limit takes); anything else goes on as typed, for the field's reader to refuse.
MAX_DIGITS = 15


def _text(form: FormData, name: str) -> str:
    value = form.get(name)
    return value.strip() if isinstance(value, str) else ""


def _limit(text: str) -> object:
    """A rate limit field: empty is no limit (null), digits a number, anything else as typed (the
    field's reader refuses it with its message)."""
    if not text:
        return None
    return int(text) if text.isascii() and text.isdigit() and len(text) <= MAX_DIGITS else text


def account_fields(form: FormData, *, with_name: bool) -> dict[str, Any]:
    """An account form's values as the management API's JSON fields."""
    given: dict[str, Any] = {}
    if with_name:
        given["name"] = _text(form, "name")
    given["allowed_models"] = (
        None if _text(form, "models") != "some" else [m for m in form.getlist("model") if isinstance(m, str)]
    )
    given["rpm_limit"] = _limit(_text(form, "rpm_limit"))
    given["tpm_limit"] = _limit(_text(form, "tpm_limit"))
    return given


def routes(console: Console) -> list[BaseRoute]:
    state = console.state
    store = state.store
    configured = [m.name for m in state.settings.models]

    async def account_of(request: Request) -> Account:
        return await management.account(store, request.path_params["account_id"])

    async def accounts_page(
        request: Request,
        viewer: Viewer,
        status: int = 200,
        error: str | None = None,
        given: Mapping[str, Any] | None = None,
    ) -> Response:
        accounts = await store.list_accounts()
        return page(
            request,
            "operator_accounts.html",
            viewer,
            status=status,
            accounts=accounts,
            configured=configured,
            error=error,
            given=given or {},
        )

    async def accounts(request: Request, viewer: Viewer) -> Response:
        return await accounts_page(request, viewer)

    async def create_account(request: Request, viewer: Viewer) -> Response:
        form = await form_of(request)
        given = {**account_fields(form, with_name=True), "balance": _text(form, "balance") or "0"}
        try:
            account = await management.create_account(store, configured, given)
        except GatewayError as err:
            if err.status >= 500:
                raise
            return await accounts_page(request, viewer, err.status, err.message, given)
        return RedirectResponse(f"{BASE}/accounts/{account.id}?created=1", status_code=303)

    async def account_page(
        request: Request, viewer: Viewer, account: Account, status: int = 200, error: str | None = None
    ) -> Response:
        return page(
            request,
            "operator_account.html",
            viewer,
            status=status,
            managed=account,
            configured=configured,
            top_ups=list(reversed(await store.list_top_ups(account.id))),
            users=await store.list_console_users(account.id),
            error=error,
            notice=_notice(request),
            idempotency_key=secrets.token_urlsafe(16),
            user_status=console_users.user_status,
        )

    async def account(request: Request, viewer: Viewer) -> Response:
        return await account_page(request, viewer, await account_of(request))

    async def update_account(request: Request, viewer: Viewer) -> Response:
        current = await account_of(request)
        form = await form_of(request)
        try:
            await management.update_account(
                store, configured, current.id, account_fields(form, with_name=True)
            )
        except GatewayError as err:
            if err.status >= 500:
                raise
            return await account_page(request, viewer, current, err.status, err.message)
        return RedirectResponse(f"{BASE}/accounts/{current.id}?saved=1", status_code=303)

    async def top_up(request: Request, viewer: Viewer) -> Response:
        current = await account_of(request)
        form = await form_of(request)
        given = {"amount": _text(form, "amount"), "note": _text(form, "note") or None}
        # The form's own key: the same form sent twice (a double click, a reload) adds money once.
        key = _text(form, "idempotency_key") or None
        try:
            entry, _ = await management.top_up(store, current.id, management.top_up_fields(given), key)
        except GatewayError as err:
            if err.status >= 500:
                raise
            return await account_page(request, viewer, current, err.status, err.message)
        return RedirectResponse(f"{BASE}/accounts/{current.id}?topped_up={entry.id}", status_code=303)

    async def users_page(
        request: Request,
        viewer: Viewer,
        status: int = 200,
        error: str | None = None,
        invited: tuple[str, str] | None = None,
        notice: str | None = None,
    ) -> Response:
        users = await store.list_console_users()
        names = {a.id: a.name for a in await store.list_accounts()}
        return page(
            request,
            "operator_users.html",
            viewer,
            status=status,
            users=users,
            accounts=names,
            error=error,
            invited=invited,
            notice=notice,
            user_status=console_users.user_status,
            preset=request.query_params.get("account_id", ""),
            once=ONCE.new,
        )

    def link(request: Request, token: str) -> str:
        return console_users.invite_url(console_users.base_url(state.settings, request, state), token)

    async def users(request: Request, viewer: Viewer) -> Response:
        return await users_page(request, viewer)

    async def create_user(request: Request, viewer: Viewer) -> Response:
        form = await form_of(request)
        role = _text(form, "role") or "member"
        given: dict[str, Any] = {"email": _text(form, "email"), "role": role}
        if role == "member":
            given["account_id"] = _text(form, "account_id") or None
        once = once_token(form)
        if not ONCE.claim(viewer.session.id, once):  # this very form again: a refresh
            return await users_page(request, viewer, notice=ALREADY_CREATED)
        try:
            user, token = await console_users.create_user(store, given)
        except GatewayError as err:
            ONCE.release(viewer.session.id, once)
            if err.status >= 500:
                raise
            return await users_page(request, viewer, err.status, err.message)
        # Shown on this page only, never again: the store keeps the token's hash.
        return await users_page(request, viewer, 201, invited=(user.email, link(request, token)))

    async def invite_user(request: Request, viewer: Viewer) -> Response:
        once = once_token(await form_of(request))
        if not ONCE.claim(viewer.session.id, once):  # this very form again: a refresh
            return await users_page(request, viewer, notice=ALREADY_INVITED)
        try:
            user, token = await console_users.invite_user(store, request.path_params["user_id"])
        except GatewayError:
            ONCE.release(viewer.session.id, once)
            raise
        return await users_page(request, viewer, invited=(user.email, link(request, token)))

    async def delete_user(request: Request, viewer: Viewer) -> Response:
        await console_users.delete_user(store, request.path_params["user_id"])
        return RedirectResponse(f"{BASE}/users", status_code=303)

    async def channels(request: Request, viewer: Viewer) -> Response:
        health = await state.router.report()  # as GET /admin/v1/channels shows it
        return page(request, "operator_channels.html", viewer, health=health)

    def operator(handler: Any) -> Any:
        return console.page(handler, operator=True)

    def form(handler: Any) -> Any:
        # An account's form has a box for every configured model.
        fields = MAX_FORM_FIELDS + len(configured)
        return bounded_body(console.page(handler, operator=True), max_fields=fields)

    return [
        Route("/operator/", operator(accounts), methods=["GET"]),
        Route("/operator/accounts", form(create_account), methods=["POST"]),
        Route("/operator/accounts/{account_id}", operator(account), methods=["GET"]),
        Route("/operator/accounts/{account_id}", form(update_account), methods=["POST"]),
        Route("/operator/accounts/{account_id}/top-ups", form(top_up), methods=["POST"]),
        Route("/operator/users", operator(users), methods=["GET"]),
        Route("/operator/users", form(create_user), methods=["POST"]),
        Route("/operator/users/{user_id}/invite", form(invite_user), methods=["POST"]),
        Route("/operator/users/{user_id}/delete", form(delete_user), methods=["POST"]),
        Route("/operator/channels", operator(channels), methods=["GET"]),
    ]


ALREADY_CREATED = (
    "That user was already created when this form was first sent (the page was refreshed): nothing"
    " was done again. Its invitation link was shown once; Reset gives a new one."
)
ALREADY_INVITED = (
    "That invitation was already made when this form was first sent (the page was refreshed):"
    " nothing was done again. Its link was shown once; Reset again for a new one."
)


def _notice(request: Request) -> str | None:
    query = request.query_params
    if "created" in query:
        return "Account created."
    if "saved" in query:
        return "Saved."
    if "topped_up" in query:
        return "Topped up: the ledger below shows it."
    return None

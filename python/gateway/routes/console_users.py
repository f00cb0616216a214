"""Console users in the management API: /admin/v1/console-users (docs/admin.md, "Console users").

The operations themselves (create a user with an invitation, open a new invitation, delete, list,
and the JSON a user is shown as) are here too, used as they are by the console's operator view
(gateway.console.operator) and by `gateway admin` (gateway.cli): one code path for all three.

A new user has no password: the answer carries an invitation link, shown this once (the store keeps
only the token's sha256), with which the user chooses a password. It works once, for INVITE_MS.
A new invitation for an existing user (a reset) ends the user's sessions and their old password.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .. import admin_fields as field
from .. import management
from ..auth import admin_token, authenticate_admin
from ..clock import now_ms, rfc3339
from ..config import Settings
from ..console.security import INVITE_MS, new_token, token_hash
from ..errors import GatewayError, invalid_request
from ..state import GatewayState
from ..store import ConsoleUser, NameTaken, Store
from ..store.records import CONSOLE_ROLES
from .admin import admin_body, no_fields, object_body
from .common import json_response, list_query, public_base

PREFIX: Final = "/admin/v1/console-users"
MAX_EMAIL_CHARS: Final = 254
INVITE_PATH: Final = "/console/invite/"


def no_user(user_id: str) -> GatewayError:
    return GatewayError("not_found", f"No console user {user_id!r}.")


def _email(value: object, param: str) -> str:
    if not isinstance(value, str):
        raise invalid_request(f"`{param}` must be an email address.", param)
    email = value.strip().lower()
    local, at, domain = email.partition("@")
    if (
        not (local and at and "." in domain)
        or len(email) > MAX_EMAIL_CHARS
        or not email.isprintable()
        or " " in email
    ):
        raise invalid_request(f"`{param}` must be an email address (name@example.com).", param)
    return email


def _role(value: object, param: str) -> str:
    if value not in CONSOLE_ROLES:
        raise invalid_request(f"`{param}` must be one of: {', '.join(CONSOLE_ROLES)}.", param)
    return str(value)


def _account_id(value: object, param: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise invalid_request(f"`{param}` must be an account id.", param)
    return value


USER_FIELDS: Final[Mapping[str, field.Reader]] = {"email": _email, "role": _role, "account_id": _account_id}


async def create_user(
    store: Store, given: Mapping[str, Any], param: Callable[[str], str] = str
) -> tuple[ConsoleUser, str]:
    """A new console user (`email`; `role` member, the default, or operator; a member's
    `account_id`) and their invitation token: the only time it exists outside the user's hands."""
    fields = field.read_fields(given, USER_FIELDS, required=("email",), param=param)
    role = fields.get("role", "member")
    account_id = fields.get("account_id")
    if role == "member":
        if account_id is None:
            raise invalid_request(
                f"A member belongs to an account: give `{param('account_id')}`.", param("account_id")
            )
        if await store.get_account(account_id) is None:
            raise GatewayError("not_found", f"No account {account_id!r}.", param=param("account_id"))
    elif account_id is not None:
        raise invalid_request(
            f"An operator sees every account: leave `{param('account_id')}` out.", param("account_id")
        )
    token = new_token()
    try:
        user = await store.create_console_user(
            fields["email"], role, account_id, token_hash(token), now_ms() + INVITE_MS
        )
    except NameTaken as exc:
        raise invalid_request(f"A console user {fields['email']!r} exists already.", param("email")) from exc
    return user, token


async def invite_user(store: Store, user_id: str) -> tuple[ConsoleUser, str]:
    """A new invitation for the user (a password reset): their password stops working and every
    session of theirs ends. Returns the user as it now is and the token."""
    token = new_token()
    if not await store.set_console_invite(user_id, token_hash(token), now_ms() + INVITE_MS):
        raise no_user(user_id)
    user = await store.get_console_user(user_id)
    if user is None:
        raise no_user(user_id)
    return user, token


async def delete_user(store: Store, user_id: str) -> ConsoleUser:
    """Delete the user (their sessions end; conversations stay with the account); returns it."""
    user = await store.get_console_user(user_id)
    if user is None or not await store.delete_console_user(user_id):
        raise no_user(user_id)
    return user


def base_url(settings: Settings, request: Request | None, state: GatewayState | None = None) -> str:
    """Where people reach the console: `[server] public_base_url`; else, answering a request, its
    own base when its host is allowed (routes/common.public_base); else the address it listens on."""
    if settings.public_base_url:
        return settings.public_base_url.rstrip("/")
    if request is not None and state is not None:
        return public_base(state, request).rstrip("/")
    listen = "127.0.0.1" if settings.host in ("", "0.0.0.0", "::") else settings.host
    return f"http://{f'[{listen}]' if ':' in listen else listen}:{settings.port}"


def invite_url(base: str, token: str) -> str:
    return f"{base}{INVITE_PATH}{token}"


def user_status(u: ConsoleUser, now: int | None = None) -> str:
    """active (has a password), invited (an invitation is open), or invitation_expired."""
    if u.password_hash is not None:
        return "active"
    if u.invite_expires_at_ms is not None and u.invite_expires_at_ms > (now_ms() if now is None else now):
        return "invited"
    return "invitation_expired"


def user_json(u: ConsoleUser) -> dict[str, Any]:
    return {
        "id": u.id,
        "object": "console_user",
        "email": u.email,
        "role": u.role,
        "account_id": u.account_id,
        "status": user_status(u),
        "invite_expires_at": None if u.invite_expires_at_ms is None else rfc3339(u.invite_expires_at_ms),
        "created_at": rfc3339(u.created_at_ms),
    }


def deleted_json(u: ConsoleUser) -> dict[str, Any]:
    """A user as deleting them answers (the API and `gateway admin delete-console-user`)."""
    return {**user_json(u), "deleted": True}


def invited_json(u: ConsoleUser, url: str) -> dict[str, Any]:
    """A user with their invitation link: shown once."""
    return {**user_json(u), "invite_url": url}


def routes(state: GatewayState) -> list[Route]:
    store = state.store
    token = admin_token(state.settings)

    def endpoint(
        handler: Callable[[Request], Awaitable[tuple[int, Any]]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def run(request: Request) -> Response:
            authenticate_admin(request, token)  # before anything else, even a 404 for an id
            status, payload = await handler(request)
            return json_response(payload, status)

        return run

    async def body(request: Request) -> dict[str, Any]:
        # The admin endpoints' reading: a lone surrogate escape is refused here, not by the store
        # (fuzz review: a 500).
        return object_body(await admin_body(request, state.settings))

    def link(request: Request, secret: str) -> str:
        return invite_url(base_url(state.settings, request, state), secret)

    async def create(request: Request) -> tuple[int, Any]:
        user, secret = await create_user(store, await body(request))
        return 201, invited_json(user, link(request, secret))

    async def list_users(request: Request) -> tuple[int, Any]:
        account_id = list_query(request, ("account_id",)).get("account_id")
        if account_id is not None:  # a filter that names nothing is a mistake, not "no users"
            await management.account(store, account_id, param="account_id")
        users = await store.list_console_users(account_id)
        return 200, {"object": "list", "data": [user_json(u) for u in users], "has_more": False}

    async def get(request: Request) -> tuple[int, Any]:
        user = await store.get_console_user(request.path_params["user_id"])
        if user is None:
            raise no_user(request.path_params["user_id"])
        return 200, user_json(user)

    async def invite(request: Request) -> tuple[int, Any]:
        no_fields(await admin_body(request, state.settings))
        user, secret = await invite_user(store, request.path_params["user_id"])
        return 200, invited_json(user, link(request, secret))

    async def delete(request: Request) -> tuple[int, Any]:
        no_fields(await admin_body(request, state.settings))
        return 200, deleted_json(await delete_user(store, request.path_params["user_id"]))

    return [
        Route(PREFIX, endpoint(create), methods=["POST"]),
        Route(PREFIX, endpoint(list_users), methods=["GET"]),
        Route(PREFIX + "/{user_id}", endpoint(get), methods=["GET"]),
        Route(PREFIX + "/{user_id}", endpoint(delete), methods=["DELETE"]),
        Route(PREFIX + "/{user_id}/invite", endpoint(invite), methods=["POST"]),
    ]

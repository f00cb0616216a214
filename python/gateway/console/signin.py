"""Signing in and out: members with their email and password, the operator with the admin token
(or as an operator user); an invitation link sets a new user's first password, once."""

from __future__ import annotations

import hmac
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from ..auth import KEY_PREFIX, admin_token
from ..clock import now_ms
from ..errors import GatewayError
from .endpoints import Console, home_of
from .forms import bounded_body, form_of
from .render import page
from .security import (
    Viewer,
    check_new_password,
    clear_session_cookie,
    hash_new_password,
    password_matches,
    secure_cookies,
    set_session_cookie,
    start_session,
    token_hash,
)


def _client(request: Request) -> str:
    return "addr:" + (request.client.host if request.client else "?")


def _next(target: str | None, fallback: str) -> str:
    """Only a path of this console is a place to go back to (never another site)."""
    if target and target.startswith("/console/") and not target.startswith("//"):
        parts = urlsplit(target)
        if not parts.scheme and not parts.netloc:
            return target
    return fallback


def routes(console: Console) -> list[Route]:
    state = console.state
    store = state.store
    token = admin_token(state.settings)

    def signed_in(request: Request, session_token: str, viewer_home: str) -> Response:
        response = RedirectResponse(_next(request.query_params.get("next"), viewer_home), status_code=303)
        set_session_cookie(response, session_token, secure_cookies(request, state.settings.public_base_url))
        return response

    async def login_form(request: Request, viewer: Viewer | None) -> Response:
        if viewer is not None:
            return RedirectResponse(home_of(viewer), status_code=303)
        return page(request, "login.html", None, error=None, email="", operator_enabled=token is not None)

    async def login(request: Request, viewer: Viewer | None) -> Response:
        form = await form_of(request)
        email = str(form.get("email") or "").strip().lower()
        password = str(form.get("password") or "")
        presented_token = str(form.get("admin_token") or "")
        client = _client(request)

        def again(message: str, status: int) -> Response:
            return page(
                request, "login.html", None, status=status, error=message, email=email,
                operator_enabled=token is not None,
            )  # fmt: skip

        try:
            if presented_token:
                console.throttle.check(client)
                if presented_token.startswith(KEY_PREFIX):
                    raise GatewayError("forbidden", "An API key cannot open the console.")
                if token is None or not hmac.compare_digest(presented_token.encode(), token.encode()):
                    console.throttle.failed(client)
                    return again("That admin token is not right.", 401)
                session_token, _ = await start_session(store, None, "operator", None, now_ms())
                return signed_in(request, session_token, "/console/operator/")
            who = ("email:" + email, client)
            console.throttle.check(*who)
            if password.startswith(KEY_PREFIX) and not email:
                raise GatewayError("forbidden", "An API key cannot open the console.")
            # Counted before anything is awaited, so that concurrent attempts cannot all pass the
            # check; a right password takes it back.
            console.throttle.failed(*who)
            user = await store.find_console_user(email) if email else None
            # An unknown email costs the same password check as a known one (no timing tell).
            if not await password_matches(user.password_hash if user else None, password) or user is None:
                return again("That email and password do not match.", 401)
            console.throttle.succeeded(*who)
            session_token, _ = await start_session(store, user, user.role, user.account_id, now_ms())
            home = "/console/operator/" if user.role == "operator" else f"/console/a/{user.account_id}/"
            return signed_in(request, session_token, home)
        except GatewayError as err:
            response = again(err.message, err.status)
            response.headers.update(err.headers)
            return response

    async def logout(request: Request, viewer: Viewer) -> Response:
        await store.delete_console_session(viewer.session.id)
        response = RedirectResponse("/console/login", status_code=303)
        clear_session_cookie(response, secure_cookies(request, state.settings.public_base_url))
        return response

    async def invite_form(request: Request, viewer: Viewer | None) -> Response:
        user = await store.find_console_invite(token_hash(request.path_params["token"]), now_ms())
        if user is None:
            raise GatewayError("not_found", "This invitation link has expired or was used already.")
        return page(request, "invite.html", None, email=user.email, error=None)

    async def accept_invite(request: Request, viewer: Viewer | None) -> Response:
        user = await store.find_console_invite(token_hash(request.path_params["token"]), now_ms())
        if user is None:
            raise GatewayError("not_found", "This invitation link has expired or was used already.")
        form = await form_of(request)
        password = str(form.get("password") or "")
        try:
            check_new_password(password)
            if password != str(form.get("confirm") or ""):
                raise GatewayError("invalid_request", "The two passwords differ.", param="confirm")
        except GatewayError as err:
            return page(request, "invite.html", None, status=400, email=user.email, error=err.message)
        invite = (token_hash(request.path_params["token"]), now_ms())
        if not await store.set_console_password(user.id, await hash_new_password(password), invite):
            raise GatewayError("not_found", "This invitation link has expired or was used already.")
        session_token, _ = await start_session(store, user, user.role, user.account_id, now_ms())
        home = "/console/operator/" if user.role == "operator" else f"/console/a/{user.account_id}/"
        return signed_in(request, session_token, home)

    async def home(request: Request, viewer: Viewer) -> Response:
        return RedirectResponse(home_of(viewer), status_code=303)

    return [
        Route("/", console.page(home), methods=["GET"]),
        Route("/login", console.public(login_form), methods=["GET"]),
        Route("/login", bounded_body(console.public(login)), methods=["POST"]),
        Route("/logout", bounded_body(console.page(logout)), methods=["POST"]),
        Route("/invite/{token}", console.public(invite_form), methods=["GET"]),
        Route("/invite/{token}", bounded_body(console.public(accept_invite)), methods=["POST"]),
    ]

"""How a console route is wrapped: who may call it, its CSRF check, its error rendering and its
security headers. Pages answer HTML (errors as an error page); `api` routes answer JSON in the
spec's error format. Every account-scoped route finds its account through `account_of`, which
answers 404 for an account the viewer may not see, exactly as for one that does not exist."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from ..clock import now_ms
from ..errors import GatewayError, error_response
from ..state import GatewayState
from ..store import Account
from .render import error_page, with_security_headers
from .security import LoginThrottle, Viewer, check_csrf, check_origin, current_viewer, refuse_api_keys

Handler = Callable[[Request, Viewer], Awaitable[Response]]
PublicHandler = Callable[[Request, Viewer | None], Awaitable[Response]]
Endpoint = Callable[[Request], Awaitable[Response]]


@dataclass
class Console:
    """What every console route shares."""

    state: GatewayState
    throttle: LoginThrottle = field(default_factory=LoginThrottle)

    def page(self, handler: Handler, *, operator: bool = False) -> Endpoint:
        """An HTML page for a signed-in viewer (the operator only, with `operator`); a signed-out
        browser is sent to the sign-in page and back."""
        return self._wrap(handler, api=False, operator=operator)

    def api(self, handler: Handler, *, operator: bool = False, activity: bool = True) -> Endpoint:
        """A JSON route for the console's own scripts (same session and CSRF rules). Without
        `activity` (a page's background polling), a call does not count as the viewer's activity:
        the session's idle expiry still runs."""
        return self._wrap(handler, api=True, operator=operator, activity=activity)

    def public(self, handler: PublicHandler) -> Endpoint:
        """A page anyone may open (sign-in, invitation); still CSRF-checked when signed in."""

        async def endpoint(request: Request) -> Response:
            viewer: Viewer | None = None
            try:
                refuse_api_keys(request)
                # Signed-out forms (sign-in, an invitation): their own secret is in the form, so
                # the origin check is theirs, with or without a session in this browser.
                check_origin(request, self.state.settings.public_base_url)
                viewer = await current_viewer(request, self.state.store, now_ms())
                response = await handler(request, viewer)
            except GatewayError as err:
                response = error_page(request, err, viewer)
            return with_security_headers(response)

        return endpoint

    def _wrap(self, handler: Handler, *, api: bool, operator: bool, activity: bool = True) -> Endpoint:
        async def endpoint(request: Request) -> Response:
            viewer: Viewer | None = None
            try:
                refuse_api_keys(request)
                viewer = await current_viewer(request, self.state.store, now_ms(), touch=activity)
                if viewer is None:
                    if api:
                        raise GatewayError("not_signed_in", "Sign in to the console first.")
                    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                    return with_security_headers(
                        RedirectResponse(f"/console/login?next={quote(target)}", status_code=303)
                    )
                if operator and not viewer.operator:
                    raise GatewayError("not_found", f"No such page: {request.url.path}.")
                await check_csrf(request, viewer.session, self.state.settings.public_base_url)
                response = await handler(request, viewer)
            except GatewayError as err:
                response = (
                    error_response(err, path=request.url.path) if api else error_page(request, err, viewer)
                )
            return with_security_headers(response)

        return endpoint

    async def account_of(self, request: Request, viewer: Viewer) -> Account:
        """The account named by the path's `account_id`, if the viewer may see it; else 404."""
        account_id = request.path_params["account_id"]
        account = await self.state.store.get_account(account_id) if viewer.may_see(account_id) else None
        if account is None:
            raise GatewayError("not_found", f"No account {account_id!r}.")
        return account


def home_of(viewer: Viewer) -> str:
    """Where a viewer lands: a member on their account's overview, the operator on the accounts."""
    return "/console/operator/" if viewer.operator else f"/console/a/{viewer.account_id}/"

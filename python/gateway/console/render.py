"""Server-rendered pages: Jinja2 templates (autoescaped: every value a page shows is text, never
markup, prompts and model output included) and the console's security headers on every answer."""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from ..errors import GatewayError
from .security import SECURITY_HEADERS, Viewer

if TYPE_CHECKING:
    import jinja2

HERE = Path(__file__).parent
STATIC_DIR = HERE / "static"


def money(value: Decimal | str | None) -> str:
    """US dollars for people, exact to the last digit the books hold ("$19.99796078",
    "$0.0000138"), with at least cents ("$12.50"): the console's figures are the API's."""
    if value is None:
        return "—"
    amount = Decimal(value)
    whole, _, fraction = format(abs(amount).normalize(), "f").partition(".")
    return f"{'-' if amount < 0 else ''}${whole}.{fraction.ljust(2, '0')}"


def when(ms: int | None) -> str:
    """A moment as the console shows it: to the second, in UTC, as the Logs list shows times."""
    if ms is None:
        return "—"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@functools.cache
def _templates() -> jinja2.Environment:
    """Loaded with the first page: Jinja2 costs every worker ~2 MB, and most never render one."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,  # every template, whatever its name
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["money"] = money
    env.filters["when"] = when
    return env


def page(
    request: Request, template: str, viewer: Viewer | None, status: int = 200, **context: Any
) -> HTMLResponse:
    """A whole page: `template` with the viewer (for the navigation and the CSRF token)."""
    html = (
        _templates()
        .get_template(template)
        .render(
            request=request,
            viewer=viewer,
            csrf=viewer.session.csrf if viewer is not None else "",
            path=request.url.path,
            **context,
        )
    )
    return HTMLResponse(html, status_code=status)


def error_page(request: Request, err: GatewayError, viewer: Viewer | None) -> Response:
    response = page(request, "error.html", viewer, status=err.status, error=err)
    response.headers.update(err.headers)
    return response


def with_security_headers(response: Response) -> Response:
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    return response

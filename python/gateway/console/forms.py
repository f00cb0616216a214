"""What every console form shares: bodies read within bounds (`bounded_body`: 413 past
MAX_FORM_BYTES, never buffered further; forms parsed within MAX_FORM_FIELDS fields of MAX_FORM_PART
bytes, no files) before anything else reads them, and one-time form tokens (`ONCE`), so that a page
showing a secret, when the browser sends its POST again (a refresh), says the action was done
instead of doing it again."""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from typing import Final

from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive

from ..errors import GatewayError, error_response, invalid_request
from ..routes.common import ClientGone, body_cut, read_body
from .endpoints import Endpoint
from .render import error_page, with_security_headers

# A console form: at most this many bytes (413 past them, never buffered further), fields, and
# bytes in one field; no files.
MAX_FORM_BYTES: Final = 1 << 20
MAX_FORM_FIELDS: Final = 50
MAX_FORM_PART: Final = 64 * 1024
# One-time form tokens: remembered once used for this long, at most this many in the process.
ONCE_FIELD: Final = "once"
ONCE_TTL_S: Final = 3600.0
ONCE_MAX: Final = 20_000
MAX_ONCE_CHARS: Final = 64


def bounded_body(
    endpoint: Endpoint, *, api: bool = False, limit: int = MAX_FORM_BYTES, max_fields: int = MAX_FORM_FIELDS
) -> Endpoint:
    """A POST route whose body is read within `limit` bytes (413 `request_too_large` past them, by
    its Content-Length before reading, and never buffered further) and, sent as a form, parsed
    within `max_fields` fields of MAX_FORM_PART bytes, no files: before anything else reads it
    (the console's CSRF check reads a form first, and every later `request.form()` gets this one).
    Refusals as the route answers errors: JSON for `api` routes, else an error page."""

    async def bounded(request: Request) -> Response:
        try:
            try:
                body = await read_body(request, limit)
            except ClientGone:  # cut short, or a malformed chunked body: a 400 like any bad form
                raise body_cut() from None
            replay = Request(request.scope, replay_body(body, request.receive))
            await form_of(replay, max_fields)
        except GatewayError as err:
            response = error_response(err, path=request.url.path) if api else error_page(request, err, None)
            return with_security_headers(response)
        return await endpoint(replay)

    return bounded


async def form_of(request: Request, max_fields: int = MAX_FORM_FIELDS) -> FormData:
    """The request's form, within the console's bounds (no files); empty unless sent as a form.
    Read once: later calls get the same form (bounded_body reads it first)."""
    try:
        return await request.form(max_files=0, max_fields=max_fields, max_part_size=MAX_FORM_PART)
    except (HTTPException, MultiPartException) as err:  # Starlette's word for a form past them
        detail = err.detail if isinstance(err, HTTPException) else err.message
        raise invalid_request(f"The form cannot be read: {detail}") from None


def replay_body(body: bytes, receive: Receive) -> Receive:
    """A `receive` that hands over `body` (already read) as one message, then whatever `receive`
    says next (the connection's own, or the end the caller decides)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


# ---------------------------------------------------------------- one-time form tokens


class OnceTokens:
    """One-time tokens of forms whose answer shows a secret (a key created or rotated, an
    invitation): each rendering of such a form carries a new random token (`new`); its POST claims
    it (`claim`) before acting. The same POST sent again (a refresh of the page that answered it)
    finds it claimed and does not act again. Claimed tokens are remembered per session, in this
    process, for `ttl_s`, and at most `max_entries` of them (the oldest forgotten first)."""

    def __init__(self, ttl_s: float = ONCE_TTL_S, max_entries: int = ONCE_MAX) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._used: OrderedDict[tuple[bytes, str], float] = OrderedDict()  # claimed, oldest first

    @staticmethod
    def new() -> str:
        return secrets.token_urlsafe(18)

    def claim(self, session_id: bytes, token: str) -> bool:
        """True the first time this session presents `token`; False when it was already claimed."""
        now = time.monotonic()
        while self._used and next(iter(self._used.values())) <= now - self.ttl_s:
            self._used.popitem(last=False)
        name = (session_id, token)
        if name in self._used:
            return False
        self._used[name] = now
        while len(self._used) > self.max_entries:
            self._used.popitem(last=False)
        return True

    def release(self, session_id: bytes, token: str) -> None:
        """Forget a claim whose action did not happen (refused): the form may be sent again."""
        self._used.pop((session_id, token), None)


ONCE = OnceTokens()


def once_token(form: FormData) -> str:
    """The form's one-time token; 400 without one (a form of an older page: reload it)."""
    token = form.get(ONCE_FIELD)
    if not isinstance(token, str) or not token or len(token) > MAX_ONCE_CHARS:
        raise invalid_request("This form has expired: reload the page and try again.", ONCE_FIELD)
    return token

"""Who is signed in to the console, and the rules every console request passes (docs/console.md).

- Passwords: argon2id (OWASP's parameters: 19 MiB, 2 passes, 1 lane), never stored or
  logged in the clear; an invitation token is kept as its sha256 only and works once.
- Sessions: server-side (the store's console_sessions, so any instance and worker knows them). The
  browser holds a random token in an HttpOnly, SameSite=Strict cookie scoped to /console (Secure
  when the console is served over https); the store keeps its sha256. A session ends at sign-out,
  after IDLE_MS without a request, and IDLE_MS or not after MAX_AGE_MS.
- CSRF: every state-changing request (anything but GET and HEAD) carries the session's CSRF token,
  in the form field `csrf` or the header X-CSRF-Token, and, when the browser sends one, an Origin
  of this site; otherwise 403 `forbidden`.
- Sign-in attempts: at most LOGIN_FAILURES failures per email and per client address within
  LOGIN_WINDOW_S in each process, then 429 `rate_limited` with Retry-After.
- An API key never opens the console: a request to it with `Authorization: Bearer sk-...` is 403
  `forbidden` (spec 5.6).
- Every answer carries a strict Content-Security-Policy (scripts and styles from the gateway only,
  nothing inline) and refuses framing.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import secrets
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from starlette.requests import Request
from starlette.responses import Response

from ..auth import KEY_PREFIX, presented_key
from ..errors import GatewayError
from ..store import ConsoleSession, ConsoleUser, Store

COOKIE: Final = "gateway_console"
COOKIE_PATH: Final = "/console"
IDLE_MS: Final = 30 * 60 * 1000  # a session unused this long ends
MAX_AGE_MS: Final = 12 * 60 * 60 * 1000  # and any session after this long
TOUCH_EVERY_MS: Final = 60 * 1000  # how often a session's last use is written back
INVITE_MS: Final = 7 * 24 * 60 * 60 * 1000  # an invitation link works this long, once
LOGIN_FAILURES: Final = 5  # per email
ADDRESS_FAILURES: Final = 30  # per client address (many people may share one, behind a NAT)
LOGIN_WINDOW_S: Final = 300.0
MIN_PASSWORD_CHARS: Final = 12
SAFE_METHODS: Final = frozenset({"GET", "HEAD"})

SECURITY_HEADERS: Final = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
        " connect-src 'self'; font-src 'self'; form-action 'self'; frame-ancestors 'none';"
        " base-uri 'none'"
    ),
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "cross-origin-opener-policy": "same-origin",
    "cache-control": "no-store",
}

# OWASP's recommended argon2id parameters (Password Storage Cheat Sheet): 19 MiB, 2 passes, 1 lane.
# argon2-cffi's default (64 MiB, 4 lanes) would add 64 MB to the peak memory of every worker that
# checks one password (the memory target of benches/targets.toml); a stored hash names its own
# parameters, so hashes made with others still verify.
_hasher = PasswordHasher(time_cost=2, memory_cost=19 * 1024, parallelism=1)


# argon2id takes ~0.1-0.2 s of CPU by design: done on two threads of its own per process, so that
# sign-ins never stall the event loop that streams everyone's answers (and queue behind each other).
_hashing = ThreadPoolExecutor(max_workers=2, thread_name_prefix="gateway-argon2")


# Verified when the email has no password (unknown, or invited): the answer takes as long as for a
# real account, so its timing does not tell which emails exist.
@functools.cache
def _dummy_hash() -> str:
    return _hasher.hash(secrets.token_urlsafe(16))


def hash_password(password: str) -> str:
    return _hasher.hash(password)


def _verify_dummy(password: str) -> bool:
    return _verify(_dummy_hash(), password)


def _verify(password_hash: str, password: str) -> bool:
    try:
        return _hasher.verify(password_hash, password)
    except (VerificationError, InvalidHashError):
        return False


async def password_matches(password_hash: str | None, password: str) -> bool:
    loop = asyncio.get_running_loop()
    if not password_hash:
        await loop.run_in_executor(_hashing, _verify_dummy, password)
        return False
    return await loop.run_in_executor(_hashing, _verify, password_hash, password)


async def hash_new_password(password: str) -> str:
    return await asyncio.get_running_loop().run_in_executor(_hashing, _hasher.hash, password)


def check_new_password(password: str) -> None:
    if len(password) < MIN_PASSWORD_CHARS:
        raise GatewayError(
            "invalid_request",
            f"Choose a password of at least {MIN_PASSWORD_CHARS} characters.",
            param="password",
        )


def token_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def new_token() -> str:
    return secrets.token_urlsafe(32)


@dataclass(frozen=True, slots=True)
class Viewer:
    """The signed-in person behind a console request."""

    session: ConsoleSession
    user: ConsoleUser | None  # None: the operator signed in with the admin token

    @property
    def operator(self) -> bool:
        return self.session.role == "operator"

    @property
    def account_id(self) -> str | None:
        """A member's account; None for an operator."""
        return self.session.account_id

    @property
    def name(self) -> str:
        return self.user.email if self.user is not None else "operator (admin token)"

    def may_see(self, account_id: str | None) -> bool:
        return account_id is not None and (self.operator or account_id == self.session.account_id)


def refuse_api_keys(request: Request) -> None:
    presented = presented_key(request)
    if presented and presented.startswith(KEY_PREFIX):
        raise GatewayError(
            "forbidden", "An API key cannot open the console: sign in with your email and password."
        )


def secure_cookies(request: Request, public_base_url: str | None) -> bool:
    return request.url.scheme == "https" or bool(public_base_url and public_base_url.startswith("https://"))


async def start_session(
    store: Store, user: ConsoleUser | None, role: str, account_id: str | None, now_ms: int
) -> tuple[str, ConsoleSession]:
    """A new session; returns the token for the cookie (never stored) and the session."""
    token = new_token()
    session = ConsoleSession(
        id=token_hash(token),
        user_id=None if user is None else user.id,
        role=role,
        account_id=account_id,
        csrf=secrets.token_urlsafe(24),
        created_at_ms=now_ms,
        seen_at_ms=now_ms,
        expires_at_ms=now_ms + MAX_AGE_MS,
    )
    await store.create_console_session(session)
    return token, session


def set_session_cookie(response: Response, token: str, secure: bool) -> None:
    response.set_cookie(
        COOKIE,
        token,
        max_age=MAX_AGE_MS // 1000,
        path=COOKIE_PATH,
        secure=secure,
        httponly=True,
        samesite="strict",
    )


def clear_session_cookie(response: Response, secure: bool) -> None:
    response.delete_cookie(COOKIE, path=COOKIE_PATH, secure=secure, httponly=True, samesite="strict")


async def current_viewer(request: Request, store: Store, now_ms: int, touch: bool = True) -> Viewer | None:
    """The viewer of a live session named by the request's cookie, or None (signed out, expired,
    or the user deleted). A session in use is noted as seen at most once a minute (not with
    `touch` False: a page's background polling is not its viewer's activity)."""
    token = request.cookies.get(COOKIE)
    if not token:
        return None
    session_id = token_hash(token)
    session = await store.get_console_session(session_id)
    if session is None:
        return None
    if now_ms >= session.expires_at_ms or now_ms - session.seen_at_ms >= IDLE_MS:
        await store.delete_console_session(session_id)
        return None
    user = None
    if session.user_id is not None:
        user = await store.get_console_user(session.user_id)
        if user is None or user.password_hash is None:
            await store.delete_console_session(session_id)
            return None
    if touch and now_ms - session.seen_at_ms >= TOUCH_EVERY_MS:
        await store.touch_console_session(session_id, now_ms)
    return Viewer(session, user)


def check_origin(request: Request, public_base_url: str | None = None) -> None:
    """403 for a state-changing request that the browser says comes from another site (a signed-out
    form too: nobody may sign a visitor in to someone else's session). The browser's Origin must
    name the host the request was sent to (its Host header, which a TLS-terminating proxy passes
    on while the scheme changes) or the `[server] public_base_url`."""
    if request.method in SAFE_METHODS:
        return
    origin = request.headers.get("origin")
    if origin is None:
        return  # not a browser's cross-site request: the CSRF token still decides
    sent_from = urlsplit(origin).netloc.lower()
    ours = {request.headers.get("host", "").lower()}
    if public_base_url:
        ours.add(urlsplit(public_base_url).netloc.lower())
    if not sent_from or sent_from not in ours:
        raise GatewayError("forbidden", "This request comes from another site.")


async def check_csrf(request: Request, session: ConsoleSession, public_base_url: str | None = None) -> None:
    """403 unless a state-changing request carries the session's CSRF token (and comes from this
    site when the browser says where it comes from)."""
    if request.method in SAFE_METHODS:
        return
    check_origin(request, public_base_url)
    sent = request.headers.get("x-csrf-token")
    if sent is None and request.headers.get("content-type", "").startswith(
        ("application/x-www-form-urlencoded", "multipart/form-data")
    ):
        form = await request.form(max_files=0, max_fields=50, max_part_size=64 * 1024)  # as forms.py
        value = form.get("csrf")
        sent = value if isinstance(value, str) else None
    if not sent or not hmac.compare_digest(sent.encode(), session.csrf.encode()):
        raise GatewayError("forbidden", "The CSRF token is missing or wrong: reload the page and try again.")


class LoginThrottle:
    """Failed sign-ins per email (LOGIN_FAILURES) and per client address (ADDRESS_FAILURES) within
    LOGIN_WINDOW_S, in this process (docs/console.md). Names are "email:..." or "addr:..."."""

    def __init__(
        self,
        failures: int = LOGIN_FAILURES,
        address_failures: int = ADDRESS_FAILURES,
        window_s: float = LOGIN_WINDOW_S,
    ) -> None:
        self.failures = failures
        self.address_failures = address_failures
        self.window_s = window_s
        self._seen: dict[str, deque[float]] = {}

    def _recent(self, who: str, now: float) -> deque[float]:
        times = self._seen.setdefault(who, deque())
        while times and now - times[0] >= self.window_s:
            times.popleft()
        return times

    def check(self, *who: str) -> None:
        now = time.monotonic()
        for name in who:
            times = self._recent(name, now)
            allowed = self.address_failures if name.startswith("addr:") else self.failures
            if len(times) >= allowed:
                retry = max(1, int(self.window_s - (now - times[-allowed])) + 1)
                raise GatewayError(
                    "rate_limited",
                    f"Too many failed sign-ins: try again in {retry} seconds.",
                    headers={"retry-after": str(retry)},
                )

    def failed(self, *who: str) -> None:
        now = time.monotonic()
        for name in who:
            self._recent(name, now).append(now)
        if len(self._seen) > 100_000:  # never grows without bound under a spray of names
            self._seen = {k: v for k, v in self._seen.items() if self._recent(k, now)}

    def succeeded(self, *who: str) -> None:
        """A right password forgets the email's failures and takes back this attempt from the
        address's (counted up front by `failed`, before the password was checked)."""
        for name in who:
            if name.startswith("addr:"):
                times = self._seen.get(name)
                if times:
                    times.pop()
            else:
                self._seen.pop(name, None)

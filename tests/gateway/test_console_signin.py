"""The console's door, over plain HTTP against a real gateway: who may sign in, how sessions end,
CSRF, the security headers, throttled sign-ins, invitations that work once, and accounts that stay
apart (docs/console.md)."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal

import httpx
import pytest

from gateway.clock import now_ms
from gateway.console.security import IDLE_MS, token_hash
from gateway.store import Store
from harness import Gateway, chat_model, gateway, new_console_user, new_key, with_store

TOKEN = "admin-" + "fedcba9876543210" * 3
TOKEN_ENV = "GATEWAY_TEST_CONSOLE_ADMIN"


@pytest.fixture(scope="module")
def cgw(tmp_path_factory: pytest.TempPathFactory, sim_url: str) -> Iterator[Gateway]:
    models = chat_model("openai/gpt-4o-mini", "gpt-4o-mini", sim_url)
    admin = f'\n[admin]\ntoken_env = "{TOKEN_ENV}"\n'
    with gateway(tmp_path_factory.mktemp("console"), models + admin, env={TOKEN_ENV: TOKEN}) as g:
        yield g


def client(g: Gateway) -> httpx.Client:
    return httpx.Client(base_url=g.url, timeout=30, follow_redirects=False)


def csrf_of(html: str) -> str:
    found = re.search(r'<meta name="csrf-token" content="([^"]+)"', html)
    assert found, "the page carries no CSRF token"
    return found.group(1)


@contextmanager
def sign_in(g: Gateway, email: str, password: str) -> Iterator[httpx.Client]:
    with client(g) as c:
        r = c.post("/console/login", data={"email": email, "password": password})
        assert r.status_code == 303, r.text
        yield c


def member(g: Gateway) -> tuple[str, str, str]:
    """(account id, email, password) of a new account's member."""
    key = new_key(g.settings, Decimal(5))
    email, password = new_console_user(g.settings, key.account_id)
    return key.account_id, email, password


def test_root_and_console_send_browsers_to_sign_in(cgw: Gateway) -> None:
    with client(cgw) as c:
        assert c.get("/").headers["location"] == "/console/"
        r = c.get("/console/a/acct_x/logs?model=a")
        assert r.status_code == 303
        assert r.headers["location"] == "/console/login?next=/console/a/acct_x/logs%3Fmodel%3Da"


def test_every_answer_has_a_strict_policy_and_refuses_framing(cgw: Gateway) -> None:
    """Its 404 and 405 answers too (review: they had none of the headers)."""
    with client(cgw) as c:
        answers = [c.get(path) for path in ("/console/login", "/console/a/x/", "/console/invite/nope")]
        answers += [c.get("/console/nope"), c.put("/console/login")]
        assert [r.status_code for r in answers[-2:]] == [404, 405]
        for r in answers:
            policy = r.headers["content-security-policy"]
            assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
            assert "unsafe-inline" not in policy
            assert r.headers["x-frame-options"] == "DENY"
            assert r.headers["x-content-type-options"] == "nosniff"


def test_member_signs_in_sees_their_account_and_signs_out(cgw: Gateway) -> None:
    account_id, email, password = member(cgw)
    with client(cgw) as c:
        r = c.post("/console/login", data={"email": email.upper(), "password": password})
        assert r.status_code == 303
        assert r.headers["location"] == f"/console/a/{account_id}/"
        cookie = r.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and "path=/console" in cookie
        assert "secure" not in cookie  # plain http here; https or an https public_base_url sets it
        home = c.get("/console/")
        assert home.headers["location"] == f"/console/a/{account_id}/"
        csrf = csrf_of(c.get("/console/login", follow_redirects=True).text)
        assert c.post("/console/logout", data={"csrf": csrf}).status_code == 303
        assert c.get("/console/").headers["location"].startswith("/console/login")


def test_wrong_password_and_unknown_email_look_alike(cgw: Gateway) -> None:
    _, email, _ = member(cgw)
    with client(cgw) as c:
        wrong = c.post("/console/login", data={"email": email, "password": "not-the-password"})
        unknown = c.post("/console/login", data={"email": "nobody@example.com", "password": "x" * 12})
    assert wrong.status_code == unknown.status_code == 401
    assert "do not match" in wrong.text and "do not match" in unknown.text
    assert "set-cookie" not in wrong.headers


def test_sign_in_attempts_are_throttled(cgw: Gateway) -> None:
    _, email, password = member(cgw)
    with client(cgw) as c:
        for _ in range(5):
            assert c.post("/console/login", data={"email": email, "password": "wrong"}).status_code == 401
        r = c.post("/console/login", data={"email": email, "password": password})
        assert r.status_code == 429
        assert int(r.headers["retry-after"]) > 0


def test_an_api_key_never_opens_the_console(cgw: Gateway) -> None:
    key = new_key(cgw.settings, Decimal(1))
    with client(cgw) as c:
        r = c.get("/console/", headers={"authorization": f"Bearer {key.key}"})
        assert r.status_code == 403
        r = c.post("/console/login", data={"admin_token": key.key})
        assert r.status_code == 403


def test_state_changes_need_the_csrf_token_and_this_origin(cgw: Gateway) -> None:
    _, email, password = member(cgw)
    with sign_in(cgw, email, password) as c:
        assert c.post("/console/logout").status_code == 403  # no token
        assert c.post("/console/logout", data={"csrf": "forged"}).status_code == 403
        csrf = csrf_of(c.get("/console/login", follow_redirects=True).text)
        other = c.post("/console/logout", data={"csrf": csrf}, headers={"origin": "https://evil.example"})
        assert other.status_code == 403
        assert c.get("/console/").status_code == 303  # still signed in
        assert c.get("/console/").headers["location"] != "/console/login"


def test_a_session_idle_too_long_ends(cgw: Gateway) -> None:
    account_id, email, password = member(cgw)
    with sign_in(cgw, email, password) as c:
        assert c.get(f"/console/a/{account_id}/").status_code == 200
        token = c.cookies["gateway_console"]
        with sqlite3.connect(cgw.db_path) as db:  # its last request, IDLE_MS ago
            db.execute(
                "UPDATE console_sessions SET seen_at_ms = ? WHERE id = ?",
                (now_ms() - IDLE_MS - 1000, token_hash(token)),
            )
        r = c.get(f"/console/a/{account_id}/")
        assert r.status_code == 303 and r.headers["location"].startswith("/console/login")


def test_an_invitation_sets_the_first_password_once(cgw: Gateway) -> None:
    key = new_key(cgw.settings, Decimal(1))
    invite = "inv-" + "a1b2c3d4" * 4

    async def invite_user(store: Store) -> None:
        await store.create_console_user(
            "new.member@example.com", "member", key.account_id, token_hash(invite), now_ms() + 60_000
        )

    with_store(cgw.settings, invite_user)
    with client(cgw) as c:
        assert "new.member@example.com" in c.get(f"/console/invite/{invite}").text
        short = c.post(f"/console/invite/{invite}", data={"password": "short", "confirm": "short"})
        assert short.status_code == 400
        chosen = "a long enough password"
        r = c.post(f"/console/invite/{invite}", data={"password": chosen, "confirm": chosen})
        assert r.status_code == 303 and r.headers["location"] == f"/console/a/{key.account_id}/"
    with client(cgw) as c:
        assert c.get(f"/console/invite/{invite}").status_code == 404  # used
    with sign_in(cgw, "new.member@example.com", chosen) as c:
        assert c.get("/console/").headers["location"] == f"/console/a/{key.account_id}/"


def test_operator_signs_in_with_the_admin_token(cgw: Gateway) -> None:
    with client(cgw) as c:
        assert c.post("/console/login", data={"admin_token": "wrong" * 10}).status_code == 401
        r = c.post("/console/login", data={"admin_token": TOKEN})
        assert r.status_code == 303 and r.headers["location"] == "/console/operator/"


def test_a_member_cannot_reach_another_account_by_its_id(cgw: Gateway) -> None:
    _, email, password = member(cgw)
    other_account, _, _ = member(cgw)
    with sign_in(cgw, email, password) as c:
        r = c.get(f"/console/a/{other_account}/")
        assert r.status_code == 404
        assert "Not found" in r.text
        assert c.get("/console/operator/").status_code == 404


def test_a_signed_out_script_call_is_a_json_401(cgw: Gateway) -> None:
    account_id, _, _ = member(cgw)
    with client(cgw) as c:
        r = c.get(f"/console/a/{account_id}/api/stats?range=24h")
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "not_signed_in"


def test_behind_a_tls_proxy_the_browsers_https_origin_is_this_site(cgw: Gateway) -> None:
    """nginx terminating TLS passes the Host on and speaks plain http to the gateway: the browser's
    Origin is https://<that host>, and it is the console's own."""
    _, email, password = member(cgw)
    host = cgw.url.removeprefix("http://")
    with client(cgw) as c:
        r = c.post(
            "/console/login",
            data={"email": email, "password": password},
            headers={"origin": f"https://{host}"},
        )
        assert r.status_code == 303
        csrf = csrf_of(c.get("/console/login", follow_redirects=True).text)
        assert (
            c.post("/console/logout", data={"csrf": csrf}, headers={"origin": f"https://{host}"}).status_code
            == 303
        )


def test_an_invitation_opened_in_a_signed_in_browser_works(cgw: Gateway) -> None:
    """The invitation form carries its own secret (the link), not a session's CSRF token."""
    _, email, password = member(cgw)
    key = new_key(cgw.settings, Decimal(1))
    invite = "inv-" + "e5f6a7b8" * 4

    async def invite_user(store: Store) -> None:
        await store.create_console_user(
            "second.member@example.com", "member", key.account_id, token_hash(invite), now_ms() + 60_000
        )

    with_store(cgw.settings, invite_user)
    with sign_in(cgw, email, password) as c:
        chosen = "another long password"
        r = c.post(f"/console/invite/{invite}", data={"password": chosen, "confirm": chosen})
        assert r.status_code == 303 and r.headers["location"] == f"/console/a/{key.account_id}/"


def test_a_wrong_method_names_every_method_the_path_takes(cgw: Gateway) -> None:
    """Review: the console's 405 said `allow: HEAD, GET` where the form also takes POST (Starlette
    names only the first route of a path, and the console's routes are in a mount)."""
    with client(cgw) as c:
        r = c.put("/console/login")
    assert r.status_code == 405 and set(r.headers["allow"].split(", ")) == {"GET", "HEAD", "POST"}

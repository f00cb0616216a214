"""The console's account pages in a real browser (headless chromium, conftest's `page`), against a
real gateway whose models the simulator answers: a member signs in, creates a key and reads its
secret once, calls the gateway with it through the openai client, watches the request appear in
Logs without a reload (status, latency, cost), opens it (bodies shown as text: a hostile prompt
runs nothing; the dropped parameter named), exports the CSV (a client's parameter name that a
spreadsheet would run is quoted), rotates and deletes the key (the client then gets 401); a form
showing a secret sent again (a refresh) does nothing again; bad query parameters and oversized
forms get 4xx, never 500; the overview's charts draw the seeded data; another account's member gets
404 for every page, entry and key of this account. Screenshots of each page go to docs/console/.
"""

from __future__ import annotations

import csv
import io
import os
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import TYPE_CHECKING

import httpx
import openai
import pytest

from gateway.console.logs import csv_row, view_body
from gateway.console.security import hash_password
from gateway.store import RequestLog, Store
from harness import Gateway, chat_model, gateway, new_key, screenshot, with_store

if TYPE_CHECKING:
    from playwright.sync_api import Page

TOKEN = "admin-" + "0123456789abcdef" * 3
TOKEN_ENV = "GATEWAY_TEST_CONSOLE_ACCOUNT_ADMIN"
HOSTILE = '<script>window.__pwned=1</script> and <img src=x onerror="window.__pwned=1">'
WAIT_MS = 10_000


@dataclass(frozen=True)
class Member:
    account_id: str
    email: str
    password: str
    key: str  # a key of the account, made outside the console (the seeded requests' key)
    key_id: str


def _member(g: Gateway, balance: Decimal) -> Member:
    # On a thread of its own: Playwright's loop may be marked as running in this one (conftest).
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(_new_member, g, balance).result()


def _new_member(g: Gateway, balance: Decimal) -> Member:
    handle = new_key(g.settings, balance)
    email = f"member-{os.urandom(4).hex()}@example.com"
    password = "pw-" + os.urandom(8).hex()

    async def go(store: Store) -> None:
        user = await store.create_console_user(email, "member", handle.account_id, None, None)
        await store.set_console_password(user.id, hash_password(password))

    with_store(g.settings, go)
    return Member(handle.account_id, email, password, handle.key, handle.key_id)


@pytest.fixture(scope="module")
def cgw(tmp_path_factory: pytest.TempPathFactory, sim_url: str) -> Iterator[Gateway]:
    models = chat_model("openai/gpt-4o-mini", "gpt-4o-mini", sim_url) + chat_model(
        "meta/llama-3.1-8b", "llama-3.1-8b", sim_url
    )
    admin = f'\n[admin]\ntoken_env = "{TOKEN_ENV}"\n'
    with gateway(tmp_path_factory.mktemp("console-account"), models + admin, env={TOKEN_ENV: TOKEN}) as g:
        yield g


def _chat(g: Gateway, key: str, model: str, content: str = "hello") -> httpx.Response:
    with httpx.Client(base_url=g.url, timeout=30) as c:
        return c.post(
            "/v1/chat/completions",
            headers={"authorization": f"Bearer {key}"},
            json={"model": model, "messages": [{"role": "user", "content": content}]},
        )


@pytest.fixture(scope="module")
def alice(cgw: Gateway) -> Member:
    """An account with a top-up and seeded traffic on two models (one request refused: an error)."""
    m = _member(cgw, Decimal(20))
    with httpx.Client(base_url=cgw.url, timeout=30, headers={"authorization": f"Bearer {TOKEN}"}) as admin:
        r = admin.post(f"/admin/v1/accounts/{m.account_id}/top-ups", json={"amount": "30", "note": "welcome"})
        assert r.status_code == 201, r.text
    for model in ("openai/gpt-4o-mini", "openai/gpt-4o-mini", "meta/llama-3.1-8b"):
        assert _chat(cgw, m.key, model).status_code == 200
    assert _chat(cgw, m.key, "no/such-model").status_code == 400  # model_not_found
    return m


@pytest.fixture(scope="module")
def bob(cgw: Gateway) -> Member:
    m = _member(cgw, Decimal(5))
    assert _chat(cgw, m.key, "openai/gpt-4o-mini").status_code == 200
    return m


def sign_in(page: Page, g: Gateway, m: Member) -> None:
    page.goto(f"{g.url}/console/login")
    page.fill("input[name=email]", m.email)
    page.fill("input[name=password]", m.password)
    page.click("form[action^='/console/login'] button[type=submit]")
    page.wait_for_url(f"{g.url}/console/a/{m.account_id}/")


def shot(page: Page, name: str) -> None:
    screenshot(page, name)


def form_values(page: Page, selector: str) -> dict[str, str | float | bool]:
    """The fields a form would send as it stands (its hidden csrf and once tokens included)."""
    values: dict[str, str | float | bool] = page.locator(selector).evaluate(
        "form => Object.fromEntries(new FormData(form))"
    )
    return values


def test_key_request_logs_entry_csv_rotate_delete(page: Page, cgw: Gateway, alice: Member) -> None:
    from playwright.sync_api import expect

    page.on("dialog", lambda dialog: dialog.accept())  # data-confirm on rotate and delete
    sign_in(page, cgw, alice)
    base = f"{cgw.url}/console/a/{alice.account_id}"

    # Create a key: the secret is on the page that answers the form, once.
    page.goto(f"{base}/keys")
    page.fill("#create-key input[name=name]", "browser key")
    page.fill("#create-key input[name=credit_limit]", "5.00")
    page.select_option("#create-key select[name=limit_reset]", "monthly")
    sent = form_values(page, "#create-key")
    assert sent["once"] and sent["csrf"]
    page.click("#create-key button[type=submit]")
    secret = page.locator("#secret-value").inner_text().strip()
    assert secret.startswith("sk-")
    expect(page.locator("button[data-copy=secret-value]")).to_be_visible()
    shot(page, "key-created")
    # The same form again (a refresh of that page): nothing made, no secret, "already created".
    again = page.request.post(f"{base}/keys", form=sent)
    assert again.status == 200 and "already created" in again.text()
    assert "secret-value" not in again.text() and secret not in again.text()
    # The playground's key's name is the console's own.
    named = page.request.post(f"{base}/keys", form={**sent, "once": "x1", "name": "Console playground"})
    assert named.status == 400 and "choose another" in named.text()
    page.click("#done")
    assert secret not in page.content()  # shown once: the list never shows it
    row = page.locator("#keys tr", has_text="browser key")
    expect(row).to_have_count(1)
    expect(row).to_contain_text("monthly")
    expect(page.locator("#keys")).not_to_contain_text("Console playground")
    expect(page.locator("#allowed-models")).to_contain_text("meta/llama-3.1-8b")

    # Logs open first: the request must appear without a reload.
    page.goto(f"{base}/logs")
    expect(page.locator("#logs")).to_have_attribute("data-poll", f"/console/a/{alice.account_id}/api/logs?")
    client = openai.OpenAI(api_key=secret, base_url=f"{cgw.url}/v1", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="openai/gpt-4o-mini",
        messages=[{"role": "user", "content": f"Summarise: {HOSTILE}"}],
        # Not parameters of this model: dropped, and shown as such; the second one's name is what a
        # spreadsheet would run as a formula.
        extra_body={"top_k": 5, "@SUM(A1)": 1},
    )
    request_id = raw.headers["x-service-request-id"]
    assert raw.parse().choices[0].message.content
    line = page.locator(f'#log-rows tr[data-id="{request_id}"]')
    expect(line).to_be_visible(timeout=WAIT_MS)
    expect(line).to_have_class("new")  # put there by the poll, not by a reload
    cells = line.locator("td")
    expect(cells.nth(1)).to_have_text("200")
    expect(cells.nth(2)).to_have_text(re.compile(r"^[\d,]+ ms$"))
    expect(cells.nth(3)).to_have_text(re.compile(r"^\$0\.\d+$"))
    expect(cells.nth(4)).to_have_text(re.compile(r"^[\d,]+ → [\d,]+$"))  # tokens in → out
    expect(cells.nth(6)).to_have_text("openai/gpt-4o-mini")
    expect(cells.nth(7)).to_have_text("browser key")
    expect(cells.nth(8)).to_have_text("/v1/chat/completions")
    shot(page, "logs")

    # The filters: by key, by request id.
    page.goto(f"{base}/logs?q={request_id}")
    expect(page.locator("#log-rows tr")).to_have_count(1)
    page.goto(f"{base}/logs?status=4xx")
    expect(page.locator("#log-rows tr")).to_have_count(1)  # the seeded unknown model
    expect(page.locator("#log-rows tr td").nth(1)).to_have_text("400")

    # The entry: bodies as text, nothing run, the dropped parameter named.
    page.goto(f"{base}/logs")
    page.click(f'#log-rows tr[data-id="{request_id}"] a')
    page.wait_for_url(f"{base}/logs/{request_id}")
    expect(page.locator("#request-body pre")).to_contain_text("<script>window.__pwned=1</script>")
    expect(page.locator("#request-body pre")).to_contain_text("<img src=x onerror=")
    expect(page.locator("#response-body pre")).to_contain_text('"usage"')
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert page.locator("#request-body img, #request-body script").count() == 0
    expect(page.locator("#dropped-params")).to_contain_text("top_k")
    expect(page.locator("#log-status")).to_contain_text("200")
    expect(page.locator("#log-tokens")).to_contain_text(" in + ")
    expect(page.locator("#attempts")).to_contain_text("answered")
    # Open in playground is a form (a POST with the CSRF token), not a link a prefetch would follow.
    opener = page.locator("#open-playground-form")
    expect(opener).to_have_attribute("method", "post")
    expect(opener).to_have_attribute(
        "action", f"/console/a/{alice.account_id}/playground/from-log/{request_id}"
    )
    assert opener.locator("input[name=csrf]").get_attribute("value")
    shot(page, "log-entry")

    # The CSV export, with the same filters.
    export = page.request.get(f"{base}/logs.csv?model=openai/gpt-4o-mini")
    assert export.status == 200
    assert export.headers["content-disposition"].startswith("attachment;")
    rows = list(csv.DictReader(io.StringIO(export.text())))
    mine = [r for r in rows if r["id"] == request_id]
    assert len(mine) == 1 and mine[0]["status"] == "200" and mine[0]["key_name"] == "browser key"
    assert Decimal(mine[0]["cost"]) > 0 and mine[0]["dropped_params"] == "'@SUM(A1) top_k"
    assert {r["model"] for r in rows} == {"openai/gpt-4o-mini"}

    # A bad parameter is a 4xx (a filter left out, with its message, on a page), never a 500.
    long = "9" * 5000
    for url, status in (
        (f"{base}/api/logs?status=%C2%B2", 400),  # "²": a digit to str.isdigit, not to int()
        (f"{base}/logs.csv?status={long}", 400),
        (f"{base}/logs?status=%C2%B2", 200),
        (f"{base}/logs?status={long}", 200),
        (f"{base}/balance?page=%C2%B2", 200),
        (f"{base}/balance?page={long}", 200),
    ):
        assert page.request.get(url).status == status, url
    refused = page.request.get(f"{base}/logs?status=%C2%B2").text()
    assert "Status must be" in refused
    assert 'id="export-csv"' not in refused  # its export would be refused the same way

    # Rotate: a new secret once, the old one refused; delete: refused too.
    page.goto(f"{base}/keys")
    spent = page.locator("#keys tr", has_text="browser key").locator("td").nth(5)
    expect(spent).to_have_text(re.compile(r"^\$0\.\d+$"))  # its spend in this month, against its limit
    shot(page, "keys")
    rotate = page.locator("#keys tr", has_text="browser key").locator("form[action$='/rotate']")
    rotate_url = cgw.url + (rotate.get_attribute("action") or "")
    sent = form_values(page, "#keys tr:has-text('browser key') form[action$='/rotate']")
    rotate.locator("button").click()
    rotated = page.locator("#secret-value").inner_text().strip()
    assert rotated.startswith("sk-") and rotated != secret
    again = page.request.post(rotate_url, form=sent)  # a refresh: not rotated again
    assert again.status == 200 and "already rotated" in again.text() and "secret-value" not in again.text()
    with pytest.raises(openai.AuthenticationError):
        client.models.list()
    fresh = openai.OpenAI(api_key=rotated, base_url=f"{cgw.url}/v1", max_retries=0)
    assert fresh.models.list().data
    page.goto(f"{base}/keys")
    page.locator("#keys tr", has_text="browser key").locator("form[action$='/delete'] button").click()
    page.wait_for_url(f"{base}/keys")
    expect(page.locator("#keys")).not_to_contain_text("browser key")
    with pytest.raises(openai.AuthenticationError):
        fresh.models.list()


def test_overview_charts_and_balance(page: Page, cgw: Gateway, alice: Member) -> None:
    from playwright.sync_api import expect

    sign_in(page, cgw, alice)
    base = f"{cgw.url}/console/a/{alice.account_id}"
    overview = page.locator("#overview")
    expect(overview).to_have_attribute("data-rendered", "3", timeout=WAIT_MS)
    assert page.locator("#overview canvas").count() == 3  # requests, spend, spend by model
    assert int(page.locator("#total-requests").inner_text()) >= 4
    assert int(page.locator("#total-errors").inner_text()) >= 1
    expect(page.locator("#total-cost")).to_have_text(re.compile(r"^\$0\.\d+$"))
    expect(page.locator("#by-model")).to_contain_text("meta/llama-3.1-8b")
    stats = page.request.get(f"{base}/api/stats?range=24h").json()
    assert len(stats["buckets"]) == 24 and stats["bucket_ms"] == 3_600_000
    assert sum(b["requests"] for b in stats["buckets"]) == stats["totals"]["requests"] >= 4
    assert all(isinstance(b["cost"], str) for b in stats["buckets"])  # exact decimal strings
    page.click(".range-switch a[data-range='24h']")
    expect(overview).to_have_attribute("data-points", "24", timeout=WAIT_MS)
    expect(page.locator(".range-switch a.on")).to_have_text("24h")
    shot(page, "overview")

    page.goto(f"{base}/balance")
    expect(page.locator("#balance")).to_contain_text("$")
    expect(page.locator("#ledger")).to_contain_text("welcome")
    expect(page.locator("#ledger")).to_contain_text("+$30")
    shot(page, "balance")


def test_another_accounts_member_gets_404(page: Page, cgw: Gateway, alice: Member, bob: Member) -> None:
    from playwright.sync_api import expect

    seen = page.request.get  # same session as the page, once signed in
    sign_in(page, cgw, bob)
    with httpx.Client(base_url=cgw.url, headers={"authorization": f"Bearer {TOKEN}"}) as admin:
        logs = admin.get("/admin/v1/logs", params={"account_id": alice.account_id}).json()
    alice_log = logs["data"][0]["id"]
    theirs = f"{cgw.url}/console/a/{alice.account_id}"
    mine = f"{cgw.url}/console/a/{bob.account_id}"
    for url in (
        f"{theirs}/",
        f"{theirs}/logs",
        f"{theirs}/logs/{alice_log}",
        f"{theirs}/keys",
        f"{theirs}/keys/{alice.key_id}",
        f"{theirs}/balance",
        f"{mine}/logs/{alice_log}",  # their entry under my own account's address
        f"{mine}/keys/{alice.key_id}",  # their key likewise
    ):
        response = page.goto(url)
        assert response is not None and response.status == 404, url
        expect(page.locator("h1")).to_have_text("Not found")
    for url in (f"{theirs}/api/stats?range=7d", f"{theirs}/api/logs", f"{theirs}/logs.csv"):
        assert seen(url).status == 404, url
    # Changing their key through my account's address is refused as well, with my CSRF token.
    page.goto(f"{mine}/keys")
    csrf = page.locator("meta[name=csrf-token]").get_attribute("content") or ""
    for action in ("delete", "rotate"):
        r = page.request.post(f"{mine}/keys/{alice.key_id}/{action}", form={"csrf": csrf})
        assert r.status == 404, action
    assert _chat(cgw, alice.key, "openai/gpt-4o-mini").status_code == 200  # still works


def test_renaming_a_key_keeps_its_expiry_and_its_name_is_not_the_playground_s(
    page: Page, cgw: Gateway, bob: Member
) -> None:
    """The edit form shows an expiry as a date: saved unchanged (a rename), the expiry stays to the
    millisecond; the end of that day would revive a key expired earlier today. And the name the
    playground's key has is refused by the management API as by the console."""
    admin = {"authorization": f"Bearer {TOKEN}"}
    expired_at = time.time_ns() // 1_000_000 - 1000
    moment = datetime.fromtimestamp(expired_at / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    made = httpx.post(
        f"{cgw.url}/admin/v1/accounts/{bob.account_id}/keys",
        headers=admin,
        json={"name": "short-lived", "expires_at": moment},
    ).json()
    sign_in(page, cgw, bob)
    page.goto(f"{cgw.url}/console/a/{bob.account_id}/keys/{made['id']}")
    page.fill("#edit-key input[name=name]", "short-lived, renamed")
    page.click("#edit-key button[type=submit]")
    page.wait_for_url(f"{cgw.url}/console/a/{bob.account_id}/keys")
    after = httpx.get(f"{cgw.url}/admin/v1/keys/{made['id']}", headers=admin).json()
    assert (after["name"], after["expires_at"]) == ("short-lived, renamed", moment)
    assert _chat(cgw, made["key"], "openai/gpt-4o-mini").json()["error"]["code"] == "key_expired"
    reserved = httpx.post(
        f"{cgw.url}/admin/v1/accounts/{bob.account_id}/keys",
        headers=admin,
        json={"name": "Console playground"},
    )
    assert reserved.status_code == 400 and reserved.json()["error"]["param"] == "name"
    renamed = httpx.patch(
        f"{cgw.url}/admin/v1/keys/{made['id']}", headers=admin, json={"name": "Console playground"}
    )
    assert renamed.status_code == 400 and renamed.json()["error"]["param"] == "name"


def test_money_is_shown_exactly() -> None:
    """The console's figures are the books' own: every digit, at least cents."""
    from gateway.console.render import money

    assert money("19.99796078") == "$19.99796078"
    assert money("0.0000138") == "$0.0000138"
    assert money("1.000000000001") == "$1.000000000001"
    assert money("12.5") == "$12.50" and money("0") == "$0.00" and money("-3.10") == "-$3.10"
    assert money(None) == "—"


def test_oversized_and_overfull_forms_are_refused(page: Page, cgw: Gateway, bob: Member) -> None:
    sign_in(page, cgw, bob)
    keys = f"{cgw.url}/console/a/{bob.account_id}/keys"
    page.goto(keys)
    csrf = page.locator("meta[name=csrf-token]").get_attribute("content") or ""
    big = page.request.post(keys, form={"csrf": csrf, "name": "x" * (1 << 20)})
    assert big.status == 413
    fields = "&".join(f"f{i}=1" for i in range(60))
    crowded = page.request.post(
        keys,
        data=f"csrf={csrf}&{fields}",
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert crowded.status == 400
    long_field = page.request.post(keys, form={"csrf": csrf, "once": "y1", "name": "z" * 70_000})
    assert long_field.status == 400
    assert page.request.post(keys, form={"csrf": csrf, "name": "no token"}).status == 400  # no `once`
    assert "no token" not in page.request.get(keys).text()


def _entry(**changes: object) -> RequestLog:
    given: dict[str, object] = {
        "id": "req_1",
        "key_id": "key_1",
        "account_id": "acct_1",
        "method": "POST",
        "path": "/v1/chat/completions",
        "model": "m",
        "status": 200,
        "error_code": None,
        "started_at_ms": 0,
        "duration_ms": 5,
        "cost": None,
        "usage_id": None,
        "attempts": None,
        "request_body": None,
        "request_bytes": 0,
        "response_body": None,
        "response_bytes": 0,
    }
    return RequestLog(**{**given, **changes})  # type: ignore[arg-type]


def test_csv_cells_a_spreadsheet_would_run_are_quoted() -> None:
    attempts = '[{"channel": "c", "dropped_params": ["=HYPERLINK(\\"http://x\\")", "top_k"]}]'
    cells = csv_row(_entry(attempts=attempts, model="+cmd", path="-p"), {"key_1": "@name"})
    assert cells[-1] == '\'=HYPERLINK("http://x") top_k'
    assert cells[6] == "'+cmd" and cells[8] == "'@name" and cells[10] == "'-p"


def test_a_deeply_nested_stored_body_shows_as_text() -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    shown = view_body(deep, len(deep))
    assert shown.kind == "text" and shown.text.startswith("[[[")
    assert view_body(b'{"a": [1]}', 10).kind == "json"


def test_the_logs_filters_read_as_the_table_shows_them() -> None:
    """A "to" takes in the minute or second it names (the table shows entries to the second), and a
    key that is not the account's lists nothing, not everything."""
    from gateway.console.logs import read_filters

    def until(text: str) -> int | None:
        return read_filters({"to": text}, "acct_1", set())[1].until_ms

    at = int(datetime(2026, 5, 1, 11, 21, tzinfo=UTC).timestamp() * 1000)
    assert until("2026-05-01T11:21") == at + 60_000
    assert until("2026-05-01T11:21:48") == at + 49_000
    assert until("2026-05-01T11:21:48.210") == at + 48_211
    # The unit is the time of day's, whatever its offset or form (time review: the colon of
    # `+00:00` made a minute read as a second).
    assert until("2026-05-01T11:21+00:00") == until("2026-05-01T11:21Z") == at + 60_000
    assert until("2026-05-01T09:21-02:00") == until("2026-05-01T16:51+0530") == at + 60_000
    assert until("2026-05-01T11:21:48+00:00") == at + 49_000
    assert until("2026-05-01T11") == at - 21 * 60_000 + 3_600_000  # the hour it names
    assert until("20260501T112148") == at + 49_000  # the basic format
    assert until("2026-05-01") == at - (11 * 60 + 21) * 60_000 + 86_400_000  # the day
    filters, query, errors = read_filters({"key": "key_other"}, "acct_1", {"key_mine"})
    assert errors == ["That key is not one of this account's."]
    assert filters.key == "" and query.key_id == "key_other" and query.account_id == "acct_1"


def test_the_console_s_own_address_and_the_browser_s_icon(cgw: Gateway) -> None:
    with httpx.Client(base_url=cgw.url) as http:
        bare = http.get("/console")
        icon = http.get("/favicon.ico")
    assert bare.status_code == 307 and bare.headers["location"] == "/console/"
    assert icon.status_code == 204 and not icon.content


def test_open_in_playground_shows_only_for_bodies_it_can_open() -> None:
    from gateway.console.logs import _opens_in_playground

    chat = b'{"model": "openai/gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}'
    assert _opens_in_playground(chat)
    assert not _opens_in_playground(chat[:40])  # cut at the log's size limit
    assert not _opens_in_playground(b'{"model": "m", "messages": []}')
    assert not _opens_in_playground(None)

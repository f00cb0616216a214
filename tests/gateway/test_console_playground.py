"""The playground, compare and the operator view, end to end in headless chromium against a real
gateway and the simulator (docs/console.md): a streamed answer with its tokens and cost as charged,
conversations kept across reloads, renamed and deleted, two models compared, a log entry opened in
the playground (a POST: its old GET link makes nothing), an expired playground key refused as the
API refuses it, bad bodies answered 4xx, accounts kept apart, CSRF, and the operator creating an
account, topping it up and inviting a member whose link works in a new browser (a refreshed
invitation page invites nobody again). Saves the screenshots docs/console/*.png."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from typing import TYPE_CHECKING, Any, TypeVar

import httpx
import pytest

from gateway import management
from gateway.clock import now_ms
from gateway.errors import GatewayError
from gateway.store import Conversation, Store
from harness import (
    Gateway,
    chat_model,
    eventually,
    gateway,
    new_console_user,
    new_key,
    screenshot,
    sim_requests,
    with_store,
)

if TYPE_CHECKING:  # the fixtures skip these tests when Playwright is missing
    from playwright.sync_api import Browser, Page

T = TypeVar("T")
TOKEN = "admin-" + "a1b2c3d4e5f60718" * 3
TOKEN_ENV = "GATEWAY_TEST_PLAYGROUND_ADMIN"
MINI, LLAMA = "openai/gpt-4o-mini", "meta/llama-3.1-8b"
PLAYGROUND_KEY = "Console playground"
EMBED = "openai/text-embedding-3-small"  # not a chat model: the playground does not chat with it


@pytest.fixture(scope="module")
def pgw(tmp_path_factory: pytest.TempPathFactory, sim_url: str) -> Iterator[Gateway]:
    models = chat_model(MINI, "gpt-4o-mini", sim_url) + chat_model(LLAMA, "llama-3.1-8b", sim_url)
    models += chat_model(EMBED, "text-embedding-3-small", sim_url, type_="embedding")
    admin = f'\n[admin]\ntoken_env = "{TOKEN_ENV}"\n'
    with gateway(tmp_path_factory.mktemp("playground"), models + admin, env={TOKEN_ENV: TOKEN}) as g:
        yield g


def off_loop(work: Callable[..., T], *args: Any) -> T:
    """`work(*args)` on a thread of its own: in a browser test Playwright holds this thread's event
    loop, so the harness's store helpers (asyncio.run) run beside it (conftest's _PlaywrightLoop)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(work, *args).result()


def member(g: Gateway, balance: str = "5") -> tuple[str, str, str]:
    """A new account with `balance` and its member: (account id, email, password)."""

    def make() -> tuple[str, str, str]:
        account_id = new_key(g.settings, Decimal(balance)).account_id
        email, password = new_console_user(g.settings, account_id)
        return account_id, email, password

    return off_loop(make)


def sign_in(page: Page, g: Gateway, email: str, password: str, then: str) -> None:
    """Sign in through the form and land on `then` (a console path)."""
    page.goto(f"{g.url}/console/login?next={then}")
    page.fill('input[name="email"]', email)
    page.fill('input[name="password"]', password)
    page.click('form:has(input[name="email"]) button[type="submit"]')
    page.wait_for_url(g.url + then)


def logged(g: Gateway, where: str, *args: Any, count: int = 1) -> list[tuple[Any, ...]]:
    """Request log rows matching `where` once there are `count` (written moments after the answer)."""

    def enough() -> list[tuple[Any, ...]] | None:
        rows = g.query(f"SELECT id, model, status, cost, key_id FROM request_logs WHERE {where}", *args)
        return rows if len(rows) >= count else None

    return eventually(enough, what=f"{count} request log entries where {where} {args}")


def form_values(page: Page, selector: str) -> dict[str, str | float | bool]:
    """The fields a form would send as it stands (its hidden csrf and once tokens included)."""
    values: dict[str, str | float | bool] = page.locator(selector).evaluate(
        "form => Object.fromEntries(new FormData(form))"
    )
    return values


def money(value: Decimal) -> str:
    """As Console.money shows an amount under a cent: every digit."""
    return "$" + format(value.normalize(), "f")


def test_chat_streams_is_charged_kept_renamed_and_deleted(
    page: Page, pgw: Gateway, sim: httpx.Client
) -> None:
    account_id, email, password = member(pgw)
    base = f"/console/a/{account_id}/playground"
    sign_in(page, pgw, email, password, base)
    assert page.locator("#model option").all_inner_texts() == [MINI, LLAMA]
    page.select_option("#model", MINI)
    first = "Hello there, playground [sim tokens=24 pace=15ms]"
    page.fill("#content", first)
    page.click("#send-button")

    # The answer shows while it streams (text before the end), then its tokens and cost.
    page.wait_for_selector(".msg.assistant.streaming .content:not(:empty)")
    answer = page.locator(".msg.assistant").last
    answer.and_(page.locator('[data-done="yes"]')).wait_for()
    text = answer.locator(".content").inner_text()
    assert len(text.split()) == 24
    meta = answer.locator(".meta").inner_text()
    request_id = answer.locator(".meta code").inner_text()
    assert re.fullmatch(r"req_[0-9a-f]+", request_id)
    # Charged like any other request, under the account's playground key, and shown as charged.
    ((_, model, status, cost, key_id),) = logged(pgw, "id = ?", request_id)
    assert (model, status) == (MINI, 200) and cost > 0
    ((key_name,),) = pgw.query("SELECT name FROM api_keys WHERE id = ?", key_id)
    assert key_name == PLAYGROUND_KEY
    assert money(cost) in meta and "24 out tokens" in meta
    ((prompt_tokens, completion_tokens, usage_cost),) = pgw.query(
        "SELECT prompt_tokens, completion_tokens, cost FROM usage_records WHERE request_id = ?", request_id
    )
    assert usage_cost == cost and f"{prompt_tokens} in + {completion_tokens} out tokens" in meta
    assert pgw.wait_balance(account_id, Decimal(5) - cost) == Decimal(5) - cost
    conversation_id = page.evaluate("() => new URL(location.href).searchParams.get('c')")
    assert conversation_id and page.locator("#conversation-list li.on").count() == 1

    # A second turn sends the whole conversation.
    page.fill("#content", "And a follow-up [sim tokens=6]")
    page.keyboard.press("Control+Enter")
    page.locator('.msg.assistant[data-done="yes"]').nth(1).wait_for()
    sent = sim_requests(sim, "And a follow-up")
    assert [m["role"] for m in sent[-1]["messages"]] == ["user", "assistant", "user"]

    # Reloaded, the conversation is there, rendered by the server (as text).
    page.reload()
    assert page.locator(".msg.user .content").all_inner_texts() == [first, "And a follow-up [sim tokens=6]"]
    assert page.locator(".msg.assistant .content").first.inner_text() == text
    assert money(cost) in page.locator(".msg.assistant .meta").first.inner_text()
    assert page.locator("#conversation-list li.on a").inner_text().startswith("Hello there, playground")
    screenshot(page, "playground")

    page.fill('form.rename input[name="title"]', "Greetings, renamed")
    page.click("form.rename button")
    page.wait_for_url(f"{pgw.url}{base}?c={conversation_id}")
    assert page.locator("#conversation-list li.on a").inner_text() == "Greetings, renamed"

    page.once("dialog", lambda dialog: dialog.accept())
    page.click("form.delete button")
    page.wait_for_url(pgw.url + base)
    assert page.locator("#conversation-list li").count() == 0
    assert pgw.query("SELECT count(*) FROM conversations WHERE account_id = ?", account_id) == [(0,)]
    assert page.goto(f"{pgw.url}{base}?c={conversation_id}").status == 404  # type: ignore[union-attr]


def test_errors_are_shown_in_the_chat(page: Page, pgw: Gateway) -> None:
    account_id, email, password = member(pgw, balance="0")
    sign_in(page, pgw, email, password, f"/console/a/{account_id}/playground")
    page.fill("#content", "No money, no answer")
    page.click("#send-button")
    failed = page.locator(".msg.failed")
    failed.wait_for()
    assert "insufficient_credits" in failed.inner_text()
    assert page.locator(".msg.assistant").count() == 0
    assert page.locator(".msg.user .content").inner_text() == "No money, no answer"


def test_a_failed_turn_is_shown_after_a_reload_and_never_sent_again(
    page: Page, pgw: Gateway, sim: httpx.Client
) -> None:
    """A turn that failed keeps its error note (shown after a reload), is not said again with the
    next turn (a refused one would have every later turn refused: review), and "Answer the last
    message" sends a waiting turn once, without the notes of its failures."""
    account_id, email, password = member(pgw, balance="0")
    sign_in(page, pgw, email, password, f"/console/a/{account_id}/playground")
    tag = os.urandom(4).hex()
    page.fill("#content", f"Broke {tag}")
    page.click("#send-button")
    page.locator(".msg.failed").wait_for()
    off_loop(pgw.top_up, account_id, "5")  # the same turn, once there is money: it runs
    page.reload()
    assert "insufficient_credits" in page.locator(".msg.failed").inner_text()
    page.click("#answer-button")
    page.locator('.msg.assistant[data-done="yes"]').wait_for()
    (retried,) = sim_requests(sim, f"Broke {tag}")
    assert retried["messages"] == [{"role": "user", "content": f"Broke {tag}"}]

    page.fill("#content", f"Fail [sim fail=500] {tag}")
    page.click("#send-button")
    page.locator(".msg.failed").nth(1).wait_for()
    page.reload()
    failures = page.locator(".msg.failed").all_inner_texts()
    assert len(failures) == 2 and "provider_error" in failures[1]
    page.fill("#content", f"Next {tag}")
    page.click("#send-button")
    page.locator('.msg.assistant[data-done="yes"]').wait_for()
    (sent,) = sim_requests(sim, f"Next {tag}")
    assert [m["content"] for m in sent["messages"] if m["role"] == "user"] == [f"Broke {tag}", f"Next {tag}"]
    assert "Fail" not in str(sent["messages"])


def test_model_output_and_prompts_stay_text(page: Page, pgw: Gateway) -> None:
    account_id, email, password = member(pgw)
    sign_in(page, pgw, email, password, f"/console/a/{account_id}/playground")
    hostile = '<img src=x onerror="window.pwned=1"><script>window.pwned=2</script> [sim tokens=3]'
    page.fill("#content", hostile)
    page.click("#send-button")
    page.locator('.msg.assistant[data-done="yes"]').wait_for()
    page.reload()
    assert page.locator(".msg.user .content").inner_text() == hostile
    assert page.locator(".msg.user .content img, .msg.user .content script").count() == 0
    assert page.evaluate("() => window.pwned") is None


def test_compare_two_models_side_by_side(page: Page, pgw: Gateway) -> None:
    account_id, email, password = member(pgw)
    sign_in(page, pgw, email, password, f"/console/a/{account_id}/compare")
    page.select_option("#model-0", MINI)
    page.select_option("#model-1", LLAMA)
    page.fill("#prompt", "Which of you is faster? [sim tokens=20 pace=10ms]")
    page.click("#compare-button")
    columns = page.locator('.compare-grid .column[data-done="yes"]')
    columns.nth(1).wait_for()
    assert columns.count() == 2
    assert [c.get_attribute("data-model") for c in columns.all()] == [MINI, LLAMA]
    rows = logged(pgw, "account_id = ?", account_id, count=2)
    costs = {model: cost for _, model, _, cost, _ in rows}
    for column in columns.all():
        assert len(column.locator(".content").inner_text().split()) == 20
        figures = column.locator(".figures").inner_text()
        assert re.search(r"first token\s*\d+ ms", figures) and re.search(r"total\s*\d+ ms", figures)
        assert money(costs[column.get_attribute("data-model")]) in figures
        assert "20 out tokens" in figures
    screenshot(page, "compare")


def test_open_a_logged_chat_request_in_the_playground(page: Page, pgw: Gateway) -> None:
    key = off_loop(new_key, pgw.settings, Decimal(5))
    email, password = off_loop(new_console_user, pgw.settings, key.account_id)
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2+2? <b>not bold</b>"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": [{"type": "text", "text": "And 3+3?"}]},
    ]
    with pgw.client(key.key) as client:
        r = client.post("/v1/chat/completions", json={"model": LLAMA, "messages": messages})
        assert r.status_code == 200, r.text
    log_id = r.headers["x-service-request-id"]
    assert logged(pgw, "id = ?", log_id)
    base = f"/console/a/{key.account_id}/playground"
    entry = f"/console/a/{key.account_id}/logs/{log_id}"
    sign_in(page, pgw, email, password, base)
    # The old link (a GET) makes nothing: it leads to the entry, whose button POSTs.
    old = page.goto(f"{pgw.url}{base}?from_log={log_id}")
    assert old is not None and old.status == 200 and page.url == pgw.url + entry
    assert pgw.query("SELECT count(*) FROM conversations WHERE account_id = ?", key.account_id) == [(0,)]
    page.click("#open-playground")
    page.wait_for_url(re.compile(r".*/playground\?c=conv_.*"))
    assert page.locator(".msg").evaluate_all("nodes => nodes.map(n => n.dataset.role)") == [
        "system",
        "user",
        "assistant",
        "user",
    ]
    assert page.locator(".msg .content").all_inner_texts() == [
        "You are terse.",
        "What is 2+2? <b>not bold</b>",
        "4",
        "And 3+3?",
    ]
    assert page.locator("#model").input_value() == LLAMA
    page.click("#answer-button")  # the last message is the user's: answer it as it is
    page.locator('.msg.assistant[data-done="yes"]').wait_for()

    # Another account's log entry is not found, as one that does not exist.
    other = off_loop(new_key, pgw.settings, Decimal(5))
    with pgw.client(other.key) as client:
        r = client.post("/v1/chat/completions", json={"model": MINI, "messages": messages[:2]})
    theirs = r.headers["x-service-request-id"]
    assert logged(pgw, "id = ?", theirs)
    answer = page.goto(f"{pgw.url}{base}?from_log={theirs}")
    assert answer is not None and answer.status == 404
    csrf = page.locator("meta[name=csrf-token]").get_attribute("content") or ""
    opened = page.request.post(f"{pgw.url}{base}/from-log/{theirs}", form={"csrf": csrf})
    assert opened.status == 404
    assert pgw.query("SELECT count(*) FROM conversations WHERE account_id = ?", key.account_id) == [(1,)]


def test_a_member_cannot_reach_another_accounts_conversation(page: Page, pgw: Gateway) -> None:
    theirs, _, _ = member(pgw)
    mine, email, password = member(pgw)
    conversation = Conversation(
        id="conv_" + os.urandom(12).hex(),
        account_id=theirs,
        user_id=None,
        title="Secret plans",
        created_at_ms=now_ms(),
        updated_at_ms=now_ms(),
    )

    async def create(store: Store) -> None:
        await store.create_conversation(conversation)

    off_loop(with_store, pgw.settings, create)
    sign_in(page, pgw, email, password, f"/console/a/{mine}/playground")
    for path in (
        f"/console/a/{theirs}/playground?c={conversation.id}",
        f"/console/a/{mine}/playground?c={conversation.id}",
        f"/console/a/{theirs}/compare",
    ):
        answer = page.goto(pgw.url + path)
        assert answer is not None and answer.status == 404, path
        assert "Secret plans" not in page.content()
    page.goto(f"{pgw.url}/console/a/{mine}/playground")
    status = page.evaluate(
        """async ([path, model]) =>
             (await Console.call(path, {method: "POST", json: {content: "hi", model}})).status""",
        [f"/console/a/{mine}/api/conversations/{conversation.id}/messages", MINI],
    )
    assert status == 404
    assert pgw.query("SELECT count(*) FROM chat_messages WHERE conversation_id = ?", conversation.id) == [
        (0,)
    ]


def test_an_expired_playground_key_stops_the_playground(page: Page, pgw: Gateway) -> None:
    account_id, email, password = member(pgw)

    async def keys(store: Store) -> None:
        # The playground's key, expired by the member; then a newer key of the same name (made
        # by the playground too, as two workers might): the oldest is the playground's, and
        # nothing replaces it.
        first, _ = await management.create_key(
            store, account_id, {"name": PLAYGROUND_KEY, "expires_at": now_ms() - 1000}, playground=True
        )
        while now_ms() <= first.created_at_ms:  # "newer": not made in the same millisecond
            await asyncio.sleep(0.001)
        await management.create_key(store, account_id, {"name": PLAYGROUND_KEY}, playground=True)
        # Nobody else may give a key its name: its secret would be in their hands.
        with pytest.raises(GatewayError, match="playground key"):
            await management.create_key(store, account_id, {"name": PLAYGROUND_KEY})
        # Nor may it be renamed away (console review): the playground would make itself an
        # uncapped key, the limit and expiry set on this one left on the renamed key.
        with pytest.raises(GatewayError, match="keeps its name"):
            await management.update_key(store, first.id, {"name": "mine now"}, account_id=account_id)
        kept = await management.update_key(store, first.id, {"name": PLAYGROUND_KEY}, account_id=account_id)
        assert kept.name == PLAYGROUND_KEY

    off_loop(with_store, pgw.settings, keys)
    sign_in(page, pgw, email, password, f"/console/a/{account_id}/playground")
    page.fill("#content", "Anyone there?")
    page.click("#send-button")
    failed = page.locator(".msg.failed")
    failed.wait_for()
    assert "key_expired" in failed.inner_text() and "has expired" in failed.inner_text()
    assert pgw.query("SELECT count(*) FROM request_logs WHERE account_id = ?", account_id) == [(0,)]
    assert pgw.query("SELECT count(*) FROM api_keys WHERE account_id = ?", account_id) == [(3,)]
    assert pgw.query("SELECT count(*) FROM chat_messages WHERE content = ?", "Anyone there?") == [(0,)]
    compare = page.evaluate(
        """async ([path, model]) => {
             const r = await Console.call(path, {method: "POST", json: {prompt: "hi", model}});
             return [r.status, (await r.json()).error.code];
           }""",
        [f"/console/a/{account_id}/api/compare", MINI],
    )
    assert compare == [401, "key_expired"]


def test_bad_bodies_get_4xx(page: Page, pgw: Gateway) -> None:
    account_id, email, password = member(pgw)
    api = f"/console/a/{account_id}/api/conversations"
    sign_in(page, pgw, email, password, f"/console/a/{account_id}/playground")
    statuses = page.evaluate(
        """async (path) => {
             const post = async (body) => (await Console.call(path, {method: "POST", body,
                 headers: {"content-type": "application/json"}})).status;
             return [
               await post("[".repeat(100000) + "]".repeat(100000)),  // nested too deeply
               await post("{}" + " ".repeat(1100000)),  // past the limit
               await post("{}"),
             ];
           }""",
        api,
    )
    assert statuses == [400, 413, 201]
    # JSON text may write "\ud800" alone, which no UTF-8 text (the store, the upstream's request)
    # can hold: refused as the model endpoints refuse it (fuzz review: a 500 from the store).
    title = r'{"title": "\ud800 hi"}'
    said = r'{"content": "\ud800 hi", "model": "MODEL"}'.replace("MODEL", MINI)
    surrogate = page.evaluate(
        """async ([path, title, said]) => {
             const json = {"content-type": "application/json"};
             const made = await Console.call(path, {method: "POST", body: "{}", headers: json});
             const created = await made.json();
             const titled = await Console.call(path, {method: "POST", body: title, headers: json});
             const sent = await Console.call(`${path}/${created.id}/messages`,
                 {method: "POST", body: said, headers: json});
             return [titled.status, sent.status];
           }""",
        [api, title, said],
    )
    assert surrogate == [400, 400]
    # A model that does not exist is the API's 400 model_not_found (review: it was 403 "not allowed"),
    # one of another type its 400 invalid_request (console review: 403 model_not_allowed too).
    for model, code in (("nope/none", "model_not_found"), (EMBED, "invalid_request")):
        codes = page.evaluate(
            """async ([path, model]) => {
                 const created = await (await Console.call(path, {method: "POST", body: "{}",
                     headers: {"content-type": "application/json"}})).json();
                 const r = await Console.call(`${path}/${created.id}/messages`, {method: "POST",
                     body: JSON.stringify({content: "hi", model}),
                     headers: {"content-type": "application/json"}});
                 return [r.status, (await r.json()).error.code];
               }""",
            [api, model],
        )
        assert codes == [400, code], model


def test_a_state_change_without_the_csrf_token_is_refused(page: Page, pgw: Gateway) -> None:
    account_id, email, password = member(pgw)
    api = f"/console/a/{account_id}/api/conversations"
    sign_in(page, pgw, email, password, f"/console/a/{account_id}/playground")
    # The browser's own session cookie, no token: refused.
    refused = page.request.post(pgw.url + api, data="{}", headers={"content-type": "application/json"})
    assert refused.status == 403 and refused.json()["error"]["code"] == "forbidden"
    plain = page.evaluate(
        """async (path) => (await fetch(path, {method: "POST", body: "{}",
               headers: {"content-type": "application/json"}})).status""",
        api,
    )
    assert plain == 403
    with_token = page.evaluate(
        "async (path) => (await Console.call(path, {method: 'POST', json: {}})).status", api
    )
    assert with_token == 201
    conversation_id = pgw.query("SELECT id FROM conversations WHERE account_id = ?", account_id)[0][0]
    form = page.request.post(
        f"{pgw.url}/console/a/{account_id}/playground/{conversation_id}/delete", form={"csrf": "wrong"}
    )
    assert form.status == 403
    assert pgw.query("SELECT count(*) FROM conversations WHERE account_id = ?", account_id) == [(1,)]


def test_the_operator_creates_an_account_tops_it_up_and_invites_a_member(
    page: Page, browser: Browser, pgw: Gateway
) -> None:
    page.goto(pgw.url + "/console/login")
    page.click("details.operator-login summary")
    page.fill('input[name="admin_token"]', TOKEN)
    page.click('form:has(input[name="admin_token"]) button[type="submit"]')
    page.wait_for_url(pgw.url + "/console/operator/")

    name = "acme-" + os.urandom(3).hex()
    form = page.locator("#create-account form")
    form.locator('input[name="name"]').fill(name)
    form.locator('input[name="balance"]').fill("10")
    form.locator('input[name="rpm_limit"]').fill("60")
    form.locator(f'input[name="model"][value="{MINI}"]').check()  # "only these"
    form.locator('button[type="submit"]').click()
    page.wait_for_url(re.compile(r".*/console/operator/accounts/acct_[0-9a-f]+\?created=1"))
    account_id = page.url.rsplit("/", 1)[1].split("?")[0]
    assert page.locator("#balance").inner_text() == "$10.00"
    admin = {"authorization": f"Bearer {TOKEN}"}
    account = httpx.get(f"{pgw.url}/admin/v1/accounts/{account_id}", headers=admin).json()
    assert (account["name"], account["allowed_models"], account["rpm_limit"]) == (name, [MINI], 60)

    top_up = page.locator("#top-up form")
    top_up.locator('input[name="amount"]').fill("25.50")
    top_up.locator('input[name="note"]').fill("invoice 1042")
    sent: dict[str, str | float | bool] = {
        name: top_up.locator(f'input[name="{name}"]').input_value()
        for name in ("csrf", "idempotency_key", "amount", "note")
    }
    top_up.locator('button[type="submit"]').click()
    page.wait_for_url(re.compile(r".*\?topped_up=.*"))
    assert page.locator("#balance").inner_text() == "$35.50"
    assert "invoice 1042" in page.locator("#ledger").inner_text()
    ledger = httpx.get(f"{pgw.url}/admin/v1/accounts/{account_id}/top-ups", headers=admin).json()["data"]
    assert [(t["amount"], t["note"]) for t in ledger][-1:] == [("25.50", "invoice 1042")]
    assert pgw.balance(account_id) == Decimal("35.50")
    # The same form sent again (a double click, a resent POST) adds nothing.
    again = page.request.post(f"{pgw.url}/console/operator/accounts/{account_id}/top-ups", form=sent)
    assert again.status == 200
    assert pgw.balance(account_id) == Decimal("35.50")

    page.locator("#settings input[name='tpm_limit']").fill("100000")
    settings = form_values(page, "#settings form")
    page.locator("#settings button[type='submit']").click()
    page.wait_for_url(re.compile(r".*\?saved=1"))
    # A number that str.isdigit takes but int() does not ("²"), or thousands of digits: 400.
    settings_url = f"{pgw.url}/console/operator/accounts/{account_id}"
    for bad in ("²", "9" * 5000):
        refused = page.request.post(settings_url, form={**settings, "rpm_limit": bad})
        assert refused.status == 400, bad
    account = httpx.get(f"{pgw.url}/admin/v1/accounts/{account_id}", headers=admin).json()
    assert (account["allowed_models"], account["rpm_limit"], account["tpm_limit"]) == ([MINI], 60, 100000)

    page.goto(pgw.url + "/console/operator/")
    assert name in page.locator("#accounts").inner_text()
    assert (
        page.locator(f'#accounts tr[data-account="{account_id}"] a[href="/console/a/{account_id}/"]').count()
        == 1
    )
    screenshot(page, "operator-accounts")

    users_url = f"{pgw.url}/console/operator/users"
    page.goto(f"{users_url}?account_id={account_id}")
    email = f"new-{os.urandom(3).hex()}@example.com"
    page.fill('#create-user-form input[name="email"]', email)
    assert page.locator("#account-choice").input_value() == account_id
    sent = form_values(page, "#create-user-form")
    page.click('#create-user-form button[type="submit"]')
    link = page.locator("#invite-url").inner_text()
    assert re.fullmatch(re.escape(pgw.url) + r"/console/invite/[A-Za-z0-9_-]{40,}", link)
    assert page.locator('button[data-copy="invite-url"]').count() == 1
    assert email in page.locator("#users").inner_text()
    screenshot(page, "operator-users")
    # The same form again (a refresh of the page showing the link): nothing done, no link.
    again = page.request.post(users_url, form=sent)
    assert again.status == 200 and "already created" in again.text() and "invite-url" not in again.text()
    page.goto(users_url)
    assert page.locator("#invite-url").count() == 0  # shown once

    # Reset: a new link (the old one stops working); the same form again makes no other one.
    reset = page.locator("#users tr", has_text=email).locator("form[action$='/invite']")
    reset_url = pgw.url + (reset.get_attribute("action") or "")
    sent = form_values(page, f"#users tr:has-text('{email}') form[action$='/invite']")
    first = page.request.post(reset_url, form=sent)
    assert first.status == 200
    found = re.search(r'id="invite-url">([^<]+)<', first.text())
    assert found is not None and found[1] != link
    link = found[1]
    again = page.request.post(reset_url, form=sent)
    assert again.status == 200 and "already made" in again.text() and "invite-url" not in again.text()

    page.goto(pgw.url + "/console/operator/channels")
    assert page.locator(f'section[data-model="{MINI}"]').count() == 1

    newcomer = browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        fresh = newcomer.new_page()
        fresh.goto(link)
        fresh.fill('input[name="password"]', "a long new password")
        fresh.fill('input[name="confirm"]', "a long new password")
        fresh.click('button[type="submit"]')
        fresh.wait_for_url(f"{pgw.url}/console/a/{account_id}/")
        playground = fresh.goto(f"{pgw.url}/console/a/{account_id}/playground")
        assert playground is not None and playground.status == 200
        assert fresh.locator("#model option").all_inner_texts() == [MINI]  # the allowed models only
        operator_page = fresh.goto(pgw.url + "/console/operator/")
        assert operator_page is not None and operator_page.status == 404  # members see no operator view
    finally:
        newcomer.close()


def test_which_turns_a_model_is_sent() -> None:
    from gateway.console.playground import FAILED, history_messages, unanswered
    from gateway.store.records import new_chat_message

    def talk(*turns: str) -> list[Any]:
        return [new_chat_message("c", role, f"{role} {i}", None) for i, role in enumerate(turns)]

    def sent(*turns: str) -> list[str]:
        return [m["content"] for m in history_messages(talk(*turns))]

    assert sent("user", "assistant", "user") == ["user 0", "assistant 1", "user 2"]
    # A refused turn, then another: the refused one is not said again.
    assert sent("user", FAILED, "user") == ["user 2"]
    assert sent("user", FAILED, FAILED, "user", "assistant") == ["user 3", "assistant 4"]
    # Tried again and answered: it stays. The last turn, failed, stays (it is what a retry sends).
    assert sent("user", FAILED, "assistant", "user", FAILED) == ["user 0", "assistant 2", "user 3"]
    # A stream cut by an error: its part answer, and the turn it answers, stay.
    assert sent("user", "assistant", FAILED, "user") == ["user 0", "assistant 1", "user 3"]
    assert unanswered(talk("user", FAILED, FAILED)) == 0
    assert unanswered(talk("user", "assistant", FAILED)) is None
    assert unanswered(talk()) is None

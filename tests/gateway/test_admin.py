"""The management API (/admin/v1) and `gateway admin` against a real gateway with an admin token:
accounts, top-ups exact to the cent under concurrency, keys that work, rotate and stop at once, and
the spec's errors for API keys (403), missing or wrong admin tokens (401) and bad input (400)."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness import Gateway, chat_model, gateway, request_logs

TOKEN_ENV = "GATEWAY_TEST_ADMIN_TOKEN"
TOKEN = "admin-" + "0123456789abcdef" * 3
MODEL = "openai/gpt-4o-mini"
OTHER_MODEL = "meta/llama-3.1-8b"
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def agw(sim_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A gateway whose management API is enabled: two chat models answered by the simulator."""
    models = chat_model(MODEL, "gpt-4o-mini", sim_url) + chat_model(OTHER_MODEL, "llama-3.1-8b", sim_url)
    admin = f'\n[admin]\ntoken_env = "{TOKEN_ENV}"\n'
    with gateway(tmp_path_factory.mktemp("admin"), models + admin, env={TOKEN_ENV: TOKEN}) as g:
        yield g


@pytest.fixture
def admin(agw: Gateway) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=agw.url + "/admin/v1", headers={"authorization": f"Bearer {TOKEN}"}, timeout=30
    ) as c:
        yield c


def ok(r: httpx.Response, status: int = 200) -> dict[str, Any]:
    """The JSON body of a successful answer, which never holds a float: money is decimal strings."""
    assert r.status_code == status, r.text
    body: dict[str, Any] = r.json()
    assert_no_floats(body)
    return body


def assert_no_floats(value: object) -> None:
    assert not isinstance(value, float), value
    if isinstance(value, dict):
        for item in value.values():
            assert_no_floats(item)
    elif isinstance(value, list):
        for item in value:
            assert_no_floats(item)


def error(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err: dict[str, Any] = r.json()["error"]
    assert err["code"] == code and err["message"] and "param" in err and err["type"]
    return err


def new_account(admin: httpx.Client, balance: str = "100", **fields: object) -> dict[str, Any]:
    name = f"acct-{time.monotonic_ns()}"
    return ok(admin.post("/accounts", json={"name": name, "balance": balance, **fields}), 201)


def new_key(admin: httpx.Client, account_id: str, **fields: object) -> dict[str, Any]:
    return ok(admin.post(f"/accounts/{account_id}/keys", json=fields), 201)


def chat(agw: Gateway, secret: str, model: str = MODEL) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    return httpx.post(agw.url + CHAT, json=body, headers={"authorization": f"Bearer {secret}"}, timeout=30)


# ---------------------------------------------------------------- accounts


def test_account_create_get_list_update(admin: httpx.Client) -> None:
    created = new_account(admin, "12.50", allowed_models=[MODEL], rpm_limit=60)
    assert created["id"].startswith("acct_") and created["object"] == "account"
    assert created["balance"] == "12.50"
    assert created["allowed_models"] == [MODEL]
    assert (created["rpm_limit"], created["tpm_limit"]) == (60, None)
    assert created["created_at"].endswith("Z")

    assert ok(admin.get(f"/accounts/{created['id']}")) == created
    listed = ok(admin.get("/accounts"))
    assert listed["object"] == "list" and created in listed["data"]

    renamed = created["name"] + "-renamed"
    updated = ok(
        admin.patch(
            f"/accounts/{created['id']}",
            json={"name": renamed, "allowed_models": None, "rpm_limit": None, "tpm_limit": 100_000},
        )
    )
    assert updated == {
        **created,
        "name": renamed,
        "allowed_models": None,
        "rpm_limit": None,
        "tpm_limit": 100_000,
    }
    assert ok(admin.patch(f"/accounts/{created['id']}", json={})) == updated


def test_account_name_is_unique(admin: httpx.Client) -> None:
    first, second = new_account(admin), new_account(admin)
    err = error(admin.post("/accounts", json={"name": first["name"]}), 400, "invalid_request")
    assert err["param"] == "name"
    err = error(
        admin.patch(f"/accounts/{second['id']}", json={"name": first["name"]}), 400, "invalid_request"
    )
    assert err["param"] == "name"


def test_an_account_name_cannot_look_like_an_id(agw: Gateway, admin: httpx.Client) -> None:
    """Review: an account named after another's id took the CLI's top-up meant for that id."""
    other = new_account(admin)
    for attempt in (
        admin.post("/accounts", json={"name": other["id"]}),
        admin.patch(f"/accounts/{new_account(admin)['id']}", json={"name": "acct_mine"}),
    ):
        assert error(attempt, 400, "invalid_request")["param"] == "name"
    # The CLI refuses such a name too (verification review), and takes an id as the id it is.
    refused = run_cli(agw, "create-account", "--name", "acct_cli")
    assert refused.returncode == 1 and "--name" in refused.stderr and "acct_" in refused.stderr, (
        refused.stderr
    )
    cli(agw, "top-up", "--account", other["id"], "--amount", "1.25")
    assert Decimal(ok(admin.get(f"/accounts/{other['id']}"))["balance"]) == Decimal(
        other["balance"]
    ) + Decimal("1.25")


def test_json_numbers_are_read_exactly(admin: httpx.Client) -> None:
    # 0.1 has no exact binary float; read from its digits it stays 0.1, and it comes back a string.
    raw = b'{"name": "exact-%d", "balance": 0.10}' % time.monotonic_ns()
    account = ok(admin.post("/accounts", content=raw), 201)
    assert account["balance"] == "0.10"
    top_up = ok(admin.post(f"/accounts/{account['id']}/top-ups", content=b'{"amount": 1e-2}'), 201)
    assert (top_up["amount"], top_up["balance_after"]) == ("0.01", "0.11")
    # Trailing zeros are no decimal places (money review: these were refused past 12 places).
    for amount, added in ((b'"0.5000000000000000"', "0.5"), (b"2.0e-12", "0.000000000002")):
        top_up = ok(admin.post(f"/accounts/{account['id']}/top-ups", content=b'{"amount": %s}' % amount), 201)
        assert Decimal(top_up["amount"]) == Decimal(added), top_up


def test_allowed_models_apply_to_the_accounts_keys(agw: Gateway, admin: httpx.Client) -> None:
    account = new_account(admin, allowed_models=[OTHER_MODEL])
    secret = new_key(admin, account["id"])["key"]
    assert chat(agw, secret, OTHER_MODEL).status_code == 200
    error(chat(agw, secret, MODEL), 403, "model_not_allowed")
    # An empty list allows no model at all; null allows every one.
    ok(admin.patch(f"/accounts/{account['id']}", json={"allowed_models": []}))
    error(chat(agw, secret, OTHER_MODEL), 403, "model_not_allowed")
    ok(admin.patch(f"/accounts/{account['id']}", json={"allowed_models": None}))
    assert chat(agw, secret, MODEL).status_code == 200


def test_a_bare_model_name_is_the_openai_model_of_that_name(agw: Gateway, admin: httpx.Client) -> None:
    """`gpt-4o-mini` is `openai/gpt-4o-mini` (as the Agents SDK and LiteLLM send it, prefix
    stripped), under the same allowed set; no other vendor's model is found that way."""
    account = new_account(admin, allowed_models=[MODEL])
    secret = new_key(admin, account["id"])["key"]
    answer = chat(agw, secret, "gpt-4o-mini")
    assert answer.status_code == 200, answer.text
    assert agw.usage_record(secret, answer.json()["id"])["model"] == MODEL
    error(chat(agw, secret, "llama-3.1-8b"), 400, "model_not_found")
    ok(admin.patch(f"/accounts/{account['id']}", json={"allowed_models": [OTHER_MODEL]}))
    error(chat(agw, secret, "gpt-4o-mini"), 403, "model_not_allowed")


# ---------------------------------------------------------------- top-ups


def test_top_up_adds_exactly_and_is_recorded(admin: httpx.Client) -> None:
    account = new_account(admin, "10")
    entry = ok(
        admin.post(f"/accounts/{account['id']}/top-ups", json={"amount": "5.25", "note": "inv 7"}), 201
    )
    assert entry["id"].startswith("topup_") and entry["object"] == "top_up"
    assert (entry["amount"], entry["balance_after"], entry["note"]) == ("5.25", "15.25", "inv 7")
    assert ok(admin.get(f"/accounts/{account['id']}"))["balance"] == "15.25"
    # The balance the account was created with is the ledger's first entry: the top-ups add up to
    # everything paid in.
    opening, last = ok(admin.get(f"/accounts/{account['id']}/top-ups"))["data"]
    assert (opening["amount"], opening["balance_after"], opening["note"]) == ("10", "10", "opening balance")
    assert last == entry


def test_a_top_up_sent_again_with_its_idempotency_key_adds_nothing(agw: Gateway, admin: httpx.Client) -> None:
    """A retried top-up (same Idempotency-Key), even twenty at once, is added once and answered with
    the first one; the same key with another amount is 409; another account has its own keys."""
    account, other = new_account(admin, "1"), new_account(admin, "1")
    path = f"/accounts/{account['id']}/top-ups"
    headers = {"authorization": f"Bearer {TOKEN}", "idempotency-key": "invoice-77"}

    async def retries() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=agw.url + "/admin/v1", headers=headers, timeout=30) as c:
            return list(await asyncio.gather(*(c.post(path, json={"amount": "2.50"}) for _ in range(20))))

    answers = asyncio.run(retries())
    entries = [ok(r, 201) for r in answers]
    assert all(e == entries[0] for e in entries) and entries[0]["balance_after"] == "3.50"
    assert sum(r.headers.get("idempotency-replayed") == "true" for r in answers) == 19
    assert ok(admin.get(f"/accounts/{account['id']}"))["balance"] == "3.50"
    assert len(ok(admin.get(path))["data"]) == 2  # the opening balance and this one
    error(
        admin.post(path, json={"amount": "3"}, headers={"idempotency-key": "invoice-77"}),
        409,
        "idempotency_key_reused",
    )
    other_path = f"/accounts/{other['id']}/top-ups"
    assert (
        ok(admin.post(other_path, json={"amount": "2.50"}, headers={"idempotency-key": "invoice-77"}), 201)[
            "balance_after"
        ]
        == "3.50"
    )
    error(
        admin.post(path, json={"amount": "1"}, headers={"idempotency-key": "x" * 256}), 400, "invalid_request"
    )


def test_fifty_concurrent_top_ups_add_exactly_fifty_cents(agw: Gateway, admin: httpx.Client) -> None:
    account = new_account(admin, "0")

    async def top_ups() -> list[httpx.Response]:
        async with httpx.AsyncClient(
            base_url=agw.url + "/admin/v1", headers={"authorization": f"Bearer {TOKEN}"}, timeout=30
        ) as c:
            path = f"/accounts/{account['id']}/top-ups"
            return await asyncio.gather(*(c.post(path, json={"amount": "0.01"}) for _ in range(50)))

    entries = [ok(r, 201) for r in asyncio.run(top_ups())]
    assert ok(admin.get(f"/accounts/{account['id']}"))["balance"] == "0.50"
    # Serialised: each top-up saw the one before it, so the balances after them are 0.01 ... 0.50.
    assert sorted(Decimal(e["balance_after"]) for e in entries) == [Decimal(i) / 100 for i in range(1, 51)]
    assert len(ok(admin.get(f"/accounts/{account['id']}/top-ups"))["data"]) == 50


def test_top_ups_and_charges_running_together_lose_nothing(agw: Gateway, admin: httpx.Client) -> None:
    account = new_account(admin, "1")
    secret = new_key(admin, account["id"])["key"]

    async def both() -> tuple[list[httpx.Response], list[httpx.Response]]:
        async with httpx.AsyncClient(base_url=agw.url, timeout=30) as c:
            admin_headers = {"authorization": f"Bearer {TOKEN}"}
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
            charges = [
                c.post(CHAT, json=body, headers={"authorization": f"Bearer {secret}"}) for _ in range(20)
            ]
            top_ups = [
                c.post(
                    f"/admin/v1/accounts/{account['id']}/top-ups",
                    json={"amount": "1.00"},
                    headers=admin_headers,
                )
                for _ in range(20)
            ]
            done = await asyncio.gather(*charges, *top_ups)
            return list(done[:20]), list(done[20:])

    charged, topped = asyncio.run(both())
    assert all(r.status_code == 200 for r in charged) and all(r.status_code == 201 for r in topped)
    spent = sum((Decimal(r.headers["x-service-cost"]) for r in charged), Decimal(0))
    assert agw.wait_balance(account["id"], Decimal(21) - spent) == Decimal(21) - spent


# ---------------------------------------------------------------- keys


def test_key_lifecycle(agw: Gateway, admin: httpx.Client) -> None:
    account = new_account(admin)
    created = new_key(
        admin,
        account["id"],
        name="ci",
        credit_limit="5.00",
        limit_reset="monthly",
        expires_at="2099-12-31T23:59:59Z",
    )
    secret = created.pop("key")
    assert secret.startswith("sk-") and created["prefix"] == secret[: len(created["prefix"])]
    assert created["id"].startswith("key_") and created["object"] == "api_key"
    assert created["account_id"] == account["id"] and created["name"] == "ci"
    assert (created["credit_limit"], created["limit_reset"]) == ("5.00", "monthly")
    assert created["expires_at"] == "2099-12-31T23:59:59.000Z"
    assert created["deleted_at"] is None and created["spent"] == "0"
    assert chat(agw, secret).status_code == 200

    # The secret is shown once: never in a listing or a lookup. What the request cost lands moments
    # after it in what the key spent this month.
    deadline = time.monotonic() + 5
    while (listed := ok(admin.get(f"/keys/{created['id']}")))["spent"] == "0" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert Decimal(listed["spent"]) > 0
    created["spent"] = listed["spent"]
    assert listed == created
    assert ok(admin.get(f"/accounts/{account['id']}/keys"))["data"] == [created]

    updated = ok(
        admin.patch(
            f"/keys/{created['id']}",
            json={"credit_limit": "7.5", "limit_reset": None, "expires_at": 4102444800000, "name": "ci-2"},
        )
    )
    assert updated == {
        **created,
        "name": "ci-2",
        "credit_limit": "7.5",
        "limit_reset": None,
        "expires_at": "2100-01-01T00:00:00.000Z",
        "spent": "0",  # a different reset period starts a fresh count
    }

    rotated = ok(admin.post(f"/keys/{created['id']}/rotate"))
    new_secret = rotated.pop("key")
    assert new_secret != secret and rotated["prefix"] == new_secret[: len(rotated["prefix"])]
    assert rotated == {**updated, "prefix": rotated["prefix"]}  # same id, same settings
    error(chat(agw, secret), 401, "invalid_api_key")
    assert chat(agw, new_secret).status_code == 200

    deleted = ok(admin.delete(f"/keys/{created['id']}"))
    assert deleted["deleted_at"] is not None
    error(chat(agw, new_secret), 401, "invalid_api_key")
    assert ok(admin.get(f"/keys/{created['id']}")) == deleted
    error(admin.delete(f"/keys/{created['id']}"), 404, "not_found")
    error(admin.post(f"/keys/{created['id']}/rotate"), 404, "not_found")
    error(admin.patch(f"/keys/{created['id']}", json={"name": "x"}), 404, "not_found")


def test_key_defaults_and_expiry_in_the_past(agw: Gateway, admin: httpx.Client) -> None:
    account = new_account(admin)
    created = new_key(admin, account["id"])
    assert created["name"] == "default"
    assert (created["credit_limit"], created["limit_reset"], created["expires_at"]) == (None, None, None)
    past = time.time_ns() // 1_000_000 - 1000
    ok(admin.patch(f"/keys/{created['id']}", json={"expires_at": past}))
    error(chat(agw, created["key"]), 401, "key_expired")
    # Seconds for milliseconds are refused, saying both readings; 0 stays a deliberate past; a
    # lower-case z is RFC 3339's too.
    said = error(
        admin.patch(f"/keys/{created['id']}", json={"expires_at": 1798761600}), 400, "invalid_request"
    )
    assert "1970-01-21T19:39:21.600Z" in said["message"] and "2027-01-01T00:00:00.000Z" in said["message"]
    assert (
        ok(admin.patch(f"/keys/{created['id']}", json={"expires_at": 0}))["expires_at"]
        == "1970-01-01T00:00:00.000Z"
    )
    changed = ok(admin.patch(f"/keys/{created['id']}", json={"expires_at": "2027-01-01T00:00:00z"}))
    assert changed["expires_at"] == "2027-01-01T00:00:00.000Z"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/accounts/acct_nope"),
        ("PATCH", "/accounts/acct_nope"),
        ("POST", "/accounts/acct_nope/top-ups"),
        ("GET", "/accounts/acct_nope/top-ups"),
        ("POST", "/accounts/acct_nope/keys"),
        ("GET", "/accounts/acct_nope/keys"),
        ("GET", "/keys/key_nope"),
        ("PATCH", "/keys/key_nope"),
        ("DELETE", "/keys/key_nope"),
        ("POST", "/keys/key_nope/rotate"),
    ],
)
def test_unknown_ids_are_404(admin: httpx.Client, method: str, path: str) -> None:
    body = {"amount": "1"} if path.endswith("top-ups") and method == "POST" else {}
    error(admin.request(method, path, json=body), 404, "not_found")


# ---------------------------------------------------------------- authentication


def test_api_keys_are_forbidden_even_valid_ones(agw: Gateway, admin: httpx.Client) -> None:
    account = new_account(admin)
    key = new_key(admin, account["id"])
    for secret in (key["key"], "sk-not-a-real-key"):
        headers = {"authorization": f"Bearer {secret}"}
        with httpx.Client(base_url=agw.url + "/admin/v1", headers=headers, timeout=30) as c:
            error(c.get("/accounts"), 403, "forbidden")
            error(c.post(f"/accounts/{account['id']}/keys", json={}), 403, "forbidden")
            error(c.patch(f"/keys/{key['id']}", json={"credit_limit": "1"}), 403, "forbidden")
            error(c.post(f"/keys/{key['id']}/rotate"), 403, "forbidden")
            error(c.delete(f"/keys/{key['id']}"), 403, "forbidden")
    r = httpx.get(agw.url + "/admin/v1/accounts", headers={"x-api-key": key["key"]})
    error(r, 403, "forbidden")
    assert chat(agw, key["key"]).status_code == 200  # untouched by all of that


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"authorization": "Bearer wrong-token"},
        {"authorization": f"Bearer {TOKEN}x"},
        {"authorization": "Basic x"},
    ],
)
def test_missing_or_wrong_admin_token_is_401(agw: Gateway, headers: dict[str, str]) -> None:
    err = error(httpx.get(agw.url + "/admin/v1/accounts", headers=headers), 401, "invalid_admin_token")
    assert err["type"] == "authentication_error"
    r = httpx.post(agw.url + "/admin/v1/accounts", headers=headers, json={"name": "x"})
    error(r, 401, "invalid_admin_token")


def test_management_api_is_disabled_without_a_token(gw: Gateway) -> None:
    # The session gateway configures no [admin] token_env.
    r = httpx.get(gw.url + "/admin/v1/accounts", headers={"authorization": f"Bearer {TOKEN}"})
    error(r, 403, "forbidden")


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "name"),
        ({"name": ""}, "name"),
        ({"name": 5}, "name"),
        ({"name": "x", "balance": "abc"}, "balance"),
        ({"name": "x", "balance": "-1"}, "balance"),
        ({"name": "x", "balance": "1e3"}, "balance"),
        ({"name": "x", "balance": "0.0000000000001"}, "balance"),
        ({"name": "x", "balance": "1000000000000"}, "balance"),
        ({"name": "x", "balance": True}, "balance"),
        ({"name": "x", "rpm_limit": 0}, "rpm_limit"),
        ({"name": "x", "rpm_limit": "60"}, "rpm_limit"),
        ({"name": "x", "tpm_limit": 1.5}, "tpm_limit"),
        ({"name": "x", "allowed_models": "openai/gpt-4o-mini"}, "allowed_models"),
        ({"name": "x", "allowed_models": ["nobody/nothing"]}, "allowed_models"),
        ({"name": "x", "balanse": "1"}, "balanse"),
    ],
)
def test_bad_account_input_is_400(admin: httpx.Client, body: dict[str, object], param: str) -> None:
    assert error(admin.post("/accounts", json=body), 400, "invalid_request")["param"] == param


def test_balance_changes_only_through_top_ups(admin: httpx.Client) -> None:
    account = new_account(admin)
    err = error(admin.patch(f"/accounts/{account['id']}", json={"balance": "5"}), 400, "invalid_request")
    assert err["param"] == "balance"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "amount"),
        ({"amount": "0"}, "amount"),
        ({"amount": "-1.00"}, "amount"),
        ({"amount": "ten"}, "amount"),
        ({"amount": None}, "amount"),
        ({"amount": "1", "note": 5}, "note"),
    ],
)
def test_bad_top_up_is_400(admin: httpx.Client, body: dict[str, object], param: str) -> None:
    account = new_account(admin, "3")
    path = f"/accounts/{account['id']}/top-ups"
    assert error(admin.post(path, json=body), 400, "invalid_request")["param"] == param
    assert ok(admin.get(f"/accounts/{account['id']}"))["balance"] == "3"


@pytest.mark.parametrize("raw", [b'{"amount": "1", "note": "\\udc00"}', b'{"\\ud800": 1}'])
def test_a_lone_surrogate_escape_is_400(admin: httpx.Client, raw: bytes) -> None:
    """JSON text may write \\ud800 alone, but no UTF-8 text (the store, an answer) can hold it."""
    account = new_account(admin, "3")
    refused = admin.post(f"/accounts/{account['id']}/top-ups", content=raw)
    assert error(refused, 400, "invalid_request")["message"].startswith("The request body is not valid JSON")
    assert ok(admin.get(f"/accounts/{account['id']}"))["balance"] == "3"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"credit_limit": "-1"}, "credit_limit"),
        ({"credit_limit": "five"}, "credit_limit"),
        ({"limit_reset": "yearly"}, "limit_reset"),
        ({"expires_at": "2026-12-31"}, "expires_at"),
        ({"expires_at": "tomorrow"}, "expires_at"),
        ({"expires_at": 1.5}, "expires_at"),
        ({"expires_at": 10**20}, "expires_at"),
        ({"expires_at": 1798761600}, "expires_at"),  # Unix seconds (2027), not 1970's milliseconds
        ({"name": None}, "name"),
        ({"secret": "sk-mine"}, "secret"),
    ],
)
def test_bad_key_input_is_400(admin: httpx.Client, body: dict[str, object], param: str) -> None:
    account = new_account(admin)
    err = error(admin.post(f"/accounts/{account['id']}/keys", json=body), 400, "invalid_request")
    assert err["param"] == param
    key = new_key(admin, account["id"])
    err = error(admin.patch(f"/keys/{key['id']}", json=body), 400, "invalid_request")
    assert err["param"] == param


@pytest.mark.parametrize("raw", [b"{", b"[]", b'{"name": NaN}', b'{"amount": Infinity}', b"[" * 100_000])
def test_malformed_bodies_are_400(admin: httpx.Client, raw: bytes) -> None:
    error(admin.post("/accounts", content=raw), 400, "invalid_request")


# ---------------------------------------------------------------- the CLI: the same operations


def run_cli(agw: Gateway, *args: str) -> subprocess.CompletedProcess[str]:
    config = agw.db_path.parent / "gateway.toml"
    return subprocess.run(
        [sys.executable, "-m", "gateway", "admin", args[0], "--config", str(config), *args[1:]],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def cli(agw: Gateway, *args: str) -> str:
    done = run_cli(agw, *args)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_cli_on_a_store_it_cannot_open_says_why_in_one_line(tmp_path: Path, sim_url: str) -> None:
    """Operator review: a store SQLite cannot open (here a directory; a read-only or full disk
    alike) printed a traceback."""
    (tmp_path / "db").mkdir()
    config = tmp_path / "gateway.toml"
    config.write_text(f'[store]\npath = "{tmp_path / "db"}"\n' + chat_model("test/chat", "sim-chat", sim_url))
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "admin", "list-accounts", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("gateway: the store cannot be used: ") and done.stderr.count("\n") == 1


def test_cli_output_that_cannot_be_written_is_not_blamed_on_the_store(agw: Gateway) -> None:
    """Operator review: every OSError read "the store cannot be used": `list-accounts | head -1`
    (a closed pipe), and `rotate-key > /dev/full` although the key had been rotated."""
    config = str(agw.db_path.parent / "gateway.toml")
    account = cli(agw, "create-account", "--name", "piped", "--balance", "1").strip()
    cli(agw, "create-account", "--name", "piped too", "--balance", "1")
    head = subprocess.run(
        # `true` reads nothing and is gone long before the command writes: a closed pipe.
        f"{sys.executable} -m gateway admin list-accounts --config {config} | true; "
        'echo "status=${PIPESTATUS[0]}" >&2',
        shell=True,
        executable="/bin/bash",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert head.stderr == "status=0\n", head.stderr
    made = run_cli(agw, "create-key", "--account", account, "--name", "k")
    key_id = made.stderr.split()[2]  # "created key key_... for account ..."
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "gateway", "admin", "rotate-key", "--config", config, "--key-id", key_id],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 1 and "store" not in done.stderr, done.stderr
    assert done.stderr == (
        "gateway: admin rotate-key ran (a change it makes is made), but its output could not be written:"
        " No space left on device\n"
    )


def test_command_line_listening_flags_are_checked_as_the_file_s_values(agw: Gateway) -> None:
    """Operator review: `--workers 0` ran the file's worker count and `--port 0` its port (joining
    a running gateway there); `demo --sim-port` equal to its port crashed after its banner, status
    0; `gateway sim` on a taken port blamed the store."""
    config = str(agw.db_path.parent / "gateway.toml")
    port = str(httpx.URL(agw.url).port)
    for args, said in (
        (["serve", "--config", config, "--workers", "0"], "--workers 0: must be positive"),
        (["serve", "--config", config, "--workers", "-1"], "--workers -1: must be positive"),
        (
            ["serve", "--config", config, "--port", "0"],
            "cannot listen on port 0: a port is a number from 1 to 65535",
        ),
        (["demo", "--config", config, "--port", port, "--sim-port", port], "is the gateway's own port"),
        (["sim", "--port", port], f"the simulator cannot listen on 127.0.0.1:{port}"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "gateway", *args], capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode in (1, 2) and said in done.stderr, (args, done.stderr)
        assert done.stderr.count("\n") == 1 and "store" not in done.stderr, done.stderr


def test_cli_readme_commands(agw: Gateway, admin: httpx.Client) -> None:
    name = f"cli-{time.monotonic_ns()}"
    account_id = cli(agw, "create-account", "--name", name, "--balance", "50").strip()
    assert ok(admin.get(f"/accounts/{account_id}"))["balance"] == "50"
    secret = cli(
        agw, "create-key", "--account", name, "--credit-limit", "3", "--limit-reset", "daily"
    ).strip()
    assert chat(agw, secret).status_code == 200
    (key,) = ok(admin.get(f"/accounts/{account_id}/keys"))["data"]
    assert (key["credit_limit"], key["limit_reset"]) == ("3", "daily")
    deleted = run_cli(agw, "delete-key", "--key-id", key["id"])
    assert deleted.stderr == f"deleted key {key['id']}: it stops working at once\n", deleted.stderr
    # The key as DELETE /admin/v1/keys/{id} answers it (docs/admin.md: single objects as the API's JSON).
    printed = json.loads(deleted.stdout)
    assert printed["id"] == key["id"] and printed["deleted_at"] is not None, printed
    assert printed == ok(admin.get(f"/keys/{key['id']}"))
    error(chat(agw, secret), 401, "invalid_api_key")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("top-up", "--account", "nobody-here", "--amount", "1"), "no account named"),
        (("create-account", "--name", "x", "--balance", "-5"), "--balance"),
        (("set-key-limit", "--key-id", "key_nope", "--credit-limit", "1"), "no live key"),
        (("set-key-limit", "--key-id", "key_nope"), "nothing to change"),
        (("rotate-key", "--key-id", "key_nope"), "no live key"),
    ],
)
def test_cli_refusals(agw: Gateway, args: tuple[str, ...], message: str) -> None:
    done = run_cli(agw, *args)
    assert done.returncode == 1 and message in done.stderr and "Traceback" not in done.stderr


def test_cli_top_up_list_limit_and_rotate(agw: Gateway, admin: httpx.Client) -> None:
    account = new_account(admin, "1.00")
    key = new_key(admin, account["id"])
    assert (
        cli(agw, "top-up", "--account", account["name"], "--amount", "0.01", "--note", "cli").strip()
        == "1.01"
    )
    assert account["name"] in cli(agw, "list-accounts")
    # The changed key, as the API answers it (admin.md: single objects are printed as JSON).
    printed = cli(
        agw, "set-key-limit", "--key-id", key["id"], "--credit-limit", "2.50", "--limit-reset", "weekly"
    )
    assert json.loads(printed) == ok(admin.get(f"/keys/{key['id']}"))
    assert run_cli(agw, "top-up", "--account", account["name"], "--amount", "0").returncode == 1
    listed = cli(agw, "list-keys", "--account", account["name"])
    assert key["id"] in listed and "2.50" in listed and "weekly" in listed and key["key"] not in listed
    assert listed.splitlines()[0].split("\t")[5] == "spent"  # in the current period, as show-key
    # --config before the action, as before it: the same command (operator review).
    config = str(agw.db_path.parent / "gateway.toml")
    before = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway",
            "admin",
            "--config",
            config,
            "list-keys",
            "--account",
            account["name"],
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert before.returncode == 0 and before.stdout == listed, before.stderr
    assert ok(admin.get(f"/keys/{key['id']}"))["credit_limit"] == "2.50"
    cli(
        agw,
        "set-key-limit",
        "--key-id",
        key["id"],
        "--credit-limit",
        "none",
        "--expires-at",
        "2030-01-01T00:00Z",
    )
    changed = ok(admin.get(f"/keys/{key['id']}"))
    assert (changed["credit_limit"], changed["limit_reset"]) == (None, "weekly")
    assert changed["expires_at"] == "2030-01-01T00:00:00.000Z"
    new_secret = cli(agw, "rotate-key", "--key-id", key["id"]).strip()
    assert new_secret.startswith("sk-")
    error(chat(agw, key["key"]), 401, "invalid_api_key")
    assert chat(agw, new_secret).status_code == 200
    ledger = ok(admin.get(f"/accounts/{account['id']}/top-ups"))["data"]
    assert [(t["amount"], t["note"]) for t in ledger] == [("1.00", "opening balance"), ("0.01", "cli")]
    # Sent again with its idempotency key: nothing added, and said so (review).
    again = ("top-up", "--account", account["name"], "--amount", "0.5", "--idempotency-key", "inv-1")
    after = cli(agw, *again).strip()
    replayed = run_cli(agw, *again)
    assert replayed.stdout.strip() == after and "nothing added" in replayed.stderr
    assert ok(admin.get(f"/accounts/{account['id']}"))["balance"] == after


def test_lists_come_a_page_at_a_time(admin: httpx.Client) -> None:
    account = new_account(admin)
    keys = [new_key(admin, account["id"], name=f"k{i}")["id"] for i in range(5)]
    path = f"/accounts/{account['id']}/keys"
    first = ok(admin.get(path, params={"limit": "2"}))
    assert [k["id"] for k in first["data"]] == keys[:2] and first["has_more"] is True
    rest = ok(admin.get(path, params={"limit": "10", "after": keys[1]}))
    assert [k["id"] for k in rest["data"]] == keys[2:] and rest["has_more"] is False
    newest = ok(admin.get("/accounts", params={"after": account["id"]}))
    assert all(a["id"] != account["id"] for a in newest["data"])
    everyone = []
    after: str | None = None
    while True:  # every account, page by page, each once
        page = ok(admin.get("/accounts", params={"limit": "7", **({"after": after} if after else {})}))
        everyone += [a["id"] for a in page["data"]]
        if not page["has_more"]:
            break
        after = page["data"][-1]["id"]
    assert len(everyone) == len(set(everyone)) and account["id"] in everyone
    error(admin.get("/accounts", params={"limit": "1001"}), 400, "invalid_request")
    # A cursor that names nothing is a mistake, not the end of the list (which would look the same).
    for list_path, cursor, what in (
        ("/accounts", "after", "account"),
        (path, "after", "key"),
        (f"/accounts/{account['id']}/top-ups", "after", "top-up of this account"),
        ("/logs", "before", "request log"),
    ):
        refused = admin.get(list_path, params={cursor: "nope_" + "x" * 200})
        body = error(refused, 400, "invalid_request")
        assert (
            body["param"] == cursor and f"`{cursor}` names no {what}: 'nope_{'x' * 95}...'" in body["message"]
        )
    # A misspelt filter would list every account's logs; a misspelt cursor page 1 for ever.
    queries = [
        ("/logs", f"account={account['id']}", "account"),
        ("/logs", "after=req_x", "after"),
        ("/accounts", f"before={account['id']}", "before"),
        ("/accounts", "limit=1&limit=2", "limit"),
    ]
    for list_path, params, param in queries:
        assert error(admin.get(list_path, params=params), 400, "invalid_request")["param"] == param
    error(admin.get("/logs", params={"account_id": "acct_nope"}), 404, "not_found")
    error(admin.get("/logs", params={"key_id": "key_nope"}), 404, "not_found")


# ---------------------------------------------------------------- the CLI: every operation of the API


def test_cli_sets_what_the_api_sets_on_accounts(agw: Gateway, admin: httpx.Client) -> None:
    """rpm_limit, tpm_limit and allowed_models, at creation and after, with the API's checks."""
    name = f"cli-limits-{time.monotonic_ns()}"
    account_id = cli(
        agw,
        "create-account",
        "--name",
        name,
        "--allowed-models",
        MODEL,
        "--rpm-limit",
        "60",
        "--tpm-limit",
        "10000",
    ).strip()
    account = ok(admin.get(f"/accounts/{account_id}"))
    assert (account["allowed_models"], account["rpm_limit"], account["tpm_limit"]) == ([MODEL], 60, 10000)
    shown = json.loads(cli(agw, "show-account", "--account", account_id))
    assert shown == account
    changed = json.loads(
        cli(
            agw,
            "update-account",
            "--account",
            name,
            "--name",
            name + "-2",
            "--rpm-limit",
            "none",
            "--allowed-models",
            f"{MODEL},{OTHER_MODEL}",
        )
    )
    assert changed == ok(admin.get(f"/accounts/{account_id}"))
    assert (changed["name"], changed["rpm_limit"], changed["tpm_limit"]) == (name + "-2", None, 10000)
    assert changed["allowed_models"] == sorted([MODEL, OTHER_MODEL])
    cli(agw, "update-account", "--account", account_id, "--allowed-models", "none", "--tpm-limit", "5")
    again = ok(admin.get(f"/accounts/{account_id}"))
    assert (again["allowed_models"], again["tpm_limit"]) == (None, 5)
    # A key of the account is limited as the API would limit it.
    secret = cli(agw, "create-key", "--account", account_id, "--expires-at", "2999-01-01T00:00:00Z").strip()
    key_id = ok(admin.get(f"/accounts/{account_id}/keys"))["data"][0]["id"]
    assert json.loads(cli(agw, "show-key", "--key-id", key_id))["expires_at"] == "2999-01-01T00:00:00.000Z"
    assert chat(agw, secret).headers["x-ratelimit-limit-tokens"] == "5"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("create-account", "--name", "x", "--rpm-limit", "0"), "`--rpm-limit` must be a positive integer"),
        (("create-account", "--name", "x", "--tpm-limit", "ten"), "`--tpm-limit` must be a positive integer"),
        (("create-account", "--name", "x", "--allowed-models", "no/such"), "`--allowed-models` names"),
        (("update-account", "--account", "nobody-here", "--rpm-limit", "1"), "no account named"),
        (("update-account", "--account", "x"), "no account named"),
        (("top-up", "--account", "nobody-here", "--amount", "1", "--idempotency-key", ""), "no account"),
        (("show-key", "--key-id", "key_nope"), "no key with id"),
        (("show-log", "--id", "req_nope"), "no request log"),
        (("list-logs", "--limit", "0"), "`--limit` must be a whole number"),
        (("list-logs", "--before", "req_nope"), "`--before` names no request log: 'req_nope'"),
        (("list-logs", "--key-id", "key_nope"), "no key with id 'key_nope'"),
        (("create-account", "--name", "x", "--rpm-limit", "-1"), 'a positive integer or "none"'),
        (("set-key-limit", "--key-id", "key_nope", "--name", ""), "`--name` must be a non-empty"),
    ],
)
def test_cli_refuses_what_the_api_refuses(agw: Gateway, args: tuple[str, ...], message: str) -> None:
    done = run_cli(agw, *args)
    assert done.returncode == 1 and message in done.stderr and "Traceback" not in done.stderr, done.stderr


@pytest.mark.parametrize("days", ["0", "-1", "inf", "nan", "ten"])
def test_cli_refuses_a_key_expired_at_birth(agw: Gateway, days: str) -> None:
    done = run_cli(agw, "create-key", "--account", "anyone", "--expires-in-days", days)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"argument --expires-in-days: '{days}' is not a number of days above 0" in done.stderr


def test_cli_ledger_logs_and_key_names(agw: Gateway, admin: httpx.Client) -> None:
    account = new_account(admin, "1.00")
    key = new_key(admin, account["id"])
    once = ("top-up", "--account", account["id"], "--amount", "0.5", "--idempotency-key", "inv-9")
    assert cli(agw, *once).strip() == cli(agw, *once).strip() == "1.50"  # the second adds nothing
    ledger = cli(agw, "list-top-ups", "--account", account["name"]).splitlines()
    assert len(ledger) == 3 and ledger[1].split("\t")[2:] == ["1.00", "1.00", "opening balance"]
    assert ledger[2].split("\t")[2:4] == ["0.5", "1.50"]
    cli(agw, "update-key", "--key-id", key["id"], "--name", "renamed")
    assert ok(admin.get(f"/keys/{key['id']}"))["name"] == "renamed"
    request_id = chat(agw, key["key"]).headers["x-service-request-id"]
    request_logs(admin, key["id"], 1)
    rows = cli(agw, "list-logs", "--key-id", key["id"]).splitlines()
    assert rows[1].split("\t")[:3] == [request_id, rows[1].split("\t")[1], "200"]
    shown = json.loads(cli(agw, "show-log", "--id", request_id))
    assert shown == ok(admin.get(f"/logs/{request_id}"))


@pytest.mark.parametrize(
    "path",
    ["/admin/v1/accounts", "/admin/v1/keys/key_nope/rotate", "/admin/v1/config/reload", "/console/login"],
)
def test_a_body_cut_short_is_400_not_500(agw: Gateway, path: str) -> None:
    """A malformed chunked body (the server says the same of one whose client left) is the 400 a
    model endpoint answers, with no traceback logged (fuzz review: 500 on every admin and console
    POST, an anonymous client's to log at will through the console's sign-in)."""
    with socket.create_connection(("127.0.0.1", int(agw.url.rsplit(":", 1)[1])), timeout=10) as s:
        s.sendall(
            f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
            "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n".encode()
        )
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
            if b"\r\n\r\n" in answer and answer.rstrip().endswith((b"}", b"</html>")):
                break
    assert answer.startswith(b"HTTP/1.1 400"), answer[:500]
    if not path.startswith("/console"):
        assert b'"code":"invalid_request"' in answer


@pytest.mark.parametrize("path", ["rotate", ""])
def test_an_endpoint_that_takes_no_field_refuses_one_and_does_nothing(admin: httpx.Client, path: str) -> None:
    """Rotate and delete take no field: one given is refused as every unknown field is, before the
    key changes (fuzz review: a rotation "with" a credit limit rotated it and dropped the limit)."""
    account = new_account(admin)
    key = new_key(admin, account["id"])
    method = "POST" if path else "DELETE"
    where = f"/keys/{key['id']}/{path}".rstrip("/")

    def send(body: bytes) -> httpx.Response:
        return admin.request(method, where, content=body)

    assert error(send(b'{"credit_limit": "5"}'), 400, "invalid_request")["param"] == "credit_limit"
    assert error(send(b"[1]"), 400, "invalid_request")
    with httpx.Client(base_url=admin.base_url.join("/"), timeout=10) as client:
        models = client.get("/v1/models", headers={"authorization": f"Bearer {key['key']}"})
    assert models.status_code == 200  # the key as it was: neither rotated nor deleted
    assert ok(admin.get(f"/keys/{key['id']}"))["credit_limit"] is None
    assert ok(send(b"{}"))["id"] == key["id"]

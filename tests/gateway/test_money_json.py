"""Money in JSON is plain decimal notation, never an exponent, with the same digits as x-service-cost:
the usage record's `cost` (a JSON number), the management API's balances, top-ups, key limits and
log costs (decimal strings), and the prices of GET /model_group/info. Read from the raw JSON text,
since a JSON parser would hide how the number was written."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from decimal import Decimal

import httpx
import pytest

from harness import Gateway, gateway, request_logs

TOKEN_ENV = "GATEWAY_TEST_ADMIN_TOKEN"
TOKEN = "admin-" + "fedcba9876543210" * 3
MODEL = "openai/text-embedding-3-small"
IMAGES = "openai/dall-e-3"
# A number with an exponent (3e-6, 2.5E+3): a JSON number token, or a string holding only one.
EXPONENT = re.compile(rb'(?:[:,\[]\s*|")-?[0-9]+(?:\.[0-9]+)?[eE][-+]?[0-9]+')


@pytest.fixture(scope="module")
def mgw(sim_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """An embedding model at OpenAI's price ($0.02 per million tokens: a few tokens cost a tenth of
    a micro-dollar) and a price small enough that Python writes it with an exponent."""
    models = f"""
[admin]
token_env = "{TOKEN_ENV}"
[[models]]
name = "{MODEL}"
type = "embedding"
[models.prices]
input = "0.02"
cached_input = "0.0000001"
[[models.channels]]
provider = "openai"
base_url = "{sim_url}/v1"
model = "text-embedding-3-small"
[[models]]
name = "{IMAGES}"
type = "image"
[models.prices]
image = "0.04"
images = {{ "1024x1792" = "0.08", "1024x1024/hd" = "0.0000002" }}
[[models.channels]]
provider = "openai"
base_url = "{sim_url}/v1"
model = "dall-e-3"
"""
    with gateway(tmp_path_factory.mktemp("money"), models, env={TOKEN_ENV: TOKEN}) as g:
        yield g


def plain(raw: bytes) -> bytes:
    assert not EXPONENT.search(raw), raw
    return raw


def test_usage_record_cost_is_the_header_in_plain_digits(mgw: Gateway) -> None:
    key = mgw.new_key()
    with mgw.client(key.key) as c:
        r = c.post("/v1/embeddings", json={"model": MODEL, "input": "hello there"})
        assert r.status_code == 200, r.text
        header = r.headers["x-service-cost"]
        assert Decimal(header) < Decimal("0.0001")  # small enough for a float to take an exponent
        deadline = time.monotonic() + 5
        while (u := c.get(f"/v1/usage/{r.json()['id']}")).status_code == 404 and time.monotonic() < deadline:
            time.sleep(0.02)
    assert u.status_code == 200, u.text
    match = re.search(rb'"cost":([^,}]+)', plain(u.content))
    assert match is not None and match.group(1).decode() == header
    assert Decimal(str(u.json()["cost"])) == Decimal(header)


def test_management_api_money_is_plain(mgw: Gateway) -> None:
    key = mgw.new_key(balance="1", credit_limit="0.0000001")
    with mgw.client(key.key) as c:
        r = c.post("/v1/embeddings", json={"model": MODEL, "input": "hi"})
        assert r.status_code == 200, r.text
        header = r.headers["x-service-cost"]
    with mgw.admin(TOKEN) as admin:
        (entry,) = request_logs(admin, key.key_id, 1)
        assert entry["cost"] == header
        raw = plain(admin.get("/logs", params={"key_id": key.key_id}).content)
        assert f'"cost":"{header}"'.encode() in raw
        top_up = admin.post(f"/accounts/{key.account_id}/top-ups", json={"amount": "0.0000001"})
        assert top_up.status_code == 201, top_up.text
        assert plain(top_up.content) and top_up.json()["amount"] == "0.0000001"
        expected = Decimal(1) - Decimal(header) + Decimal("0.0000001")
        assert Decimal(top_up.json()["balance_after"]) == expected
        for path in (f"/accounts/{key.account_id}", f"/accounts/{key.account_id}/top-ups", "/accounts"):
            plain(admin.get(path).content)
        answer = admin.get(f"/keys/{key.key_id}")
        assert plain(answer.content) and answer.json()["credit_limit"] == "0.0000001"
        plain(admin.get(f"/accounts/{key.account_id}/keys").content)


def test_model_group_info_prices_are_plain(mgw: Gateway) -> None:
    key = mgw.new_key()
    with httpx.Client(base_url=mgw.url, headers={"authorization": f"Bearer {key.key}"}) as c:
        r = c.get("/model_group/info", params={"model_group": MODEL})
    assert r.status_code == 200, r.text
    info = r.json()["data"][0]
    assert plain(r.content) and info["cached_input_cost_per_million_tokens"] == "0.0000001"
    assert info["input_cost_per_million_tokens"] == "0.02" and info["cost_per_image"] == "0"
    with httpx.Client(base_url=mgw.url, headers={"authorization": f"Bearer {key.key}"}) as c:
        r = c.get("/model_group/info", params={"model_group": IMAGES})
    info = r.json()["data"][0]
    assert plain(r.content) and info["cost_per_image"] == "0.04"
    assert info["cost_per_image_by_variant"] == {"1024x1792": "0.08", "1024x1024/hd": "0.0000002"}
    assert info["input_cost_per_million_tokens"] == "0" and info["cost_per_second"] == "0"

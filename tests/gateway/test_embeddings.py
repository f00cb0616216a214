"""POST /v1/embeddings with the official openai client: vectors, usage, cost, parameter rules."""

from __future__ import annotations

import os
from collections.abc import Iterator
from decimal import Decimal

import httpx
import openai
import pytest

from gateway.config import Prices
from gateway.pricing import Usage, cost
from harness import Gateway, KeyHandle

MODEL = "openai/text-embedding-3-small"
PRICES = Prices(
    input=Decimal("2.50"), cached_input=Decimal("1.25"), output=Decimal(10), reasoning=Decimal(10)
)


@pytest.fixture
def oai(gw: Gateway, key: KeyHandle) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gw.openai_base, api_key=key.key, max_retries=0) as c:
        yield c


def test_client_gets_vectors_in_its_default_base64_and_as_floats(
    gw: Gateway, key: KeyHandle, oai: openai.OpenAI
) -> None:
    default = oai.embeddings.create(model=MODEL, input=["one text", "another"])
    floats = oai.embeddings.create(model=MODEL, input=["one text", "another"], encoding_format="float")
    assert [d.index for d in default.data] == [0, 1]
    assert len(default.data[0].embedding) == 64
    assert default.data[0].embedding == floats.data[0].embedding  # base64 decoded by the client
    assert default.data[0].embedding != default.data[1].embedding
    assert default.usage.prompt_tokens > 0


def test_dimensions_reach_the_model_and_cost_is_charged(
    gw: Gateway, key: KeyHandle, oai: openai.OpenAI
) -> None:
    before = gw.balance(key.account_id)
    raw = oai.embeddings.with_raw_response.create(model=MODEL, input="hello there", dimensions=8)
    result = raw.parse()
    assert len(result.data[0].embedding) == 8
    charged = Decimal(raw.headers["x-service-cost"])
    assert charged == cost(PRICES, Usage(prompt_tokens=result.usage.prompt_tokens))
    assert gw.wait_balance(key.account_id, before - charged) == before - charged
    rid = raw.http_response.json()["id"]
    assert rid.startswith("embd-")
    assert raw.headers["x-service-request-id"] != rid


def test_more_dimensions_than_the_model_has_is_its_400_not_charged(
    gw: Gateway, key: KeyHandle, oai: openai.OpenAI
) -> None:
    """The simulator refuses dimensions past its models' most, as OpenAI does (review: a billion
    made it build a vector of a billion floats); the gateway passes the refusal on, uncharged."""
    before = gw.balance(key.account_id)
    with pytest.raises(openai.BadRequestError) as refused:
        oai.embeddings.create(model=MODEL, input="hello there", dimensions=1_000_000_000)
    body = refused.value.body
    assert isinstance(body, dict) and body["code"] == "invalid_request" and "dimensions" in body["message"]
    assert gw.balance(key.account_id) == before


def test_unsupported_parameters_are_dropped(gw: Gateway, key: KeyHandle, sim: httpx.Client) -> None:
    marker = "marker-" + os.urandom(6).hex()
    with gw.client(key.key) as c:
        r = c.post("/v1/embeddings", json={"model": MODEL, "input": marker, "temperature": 1, "user": "u"})
    assert r.status_code == 200, r.text
    found = [e["body"] for e in sim.get("/_sim/requests").json() if e["body"].get("input") == marker]
    assert found == [{"model": "text-embedding-3-small", "input": marker, "user": "u"}]


@pytest.mark.parametrize(
    "bad", [None, "", [], [""], [1, "x"], {"text": "x"}, [[]], True, [True], ["x"] * 2049]
)
def test_bad_input(gw: Gateway, key: KeyHandle, bad: object) -> None:
    with gw.client(key.key) as c:
        r = c.post("/v1/embeddings", json={"model": MODEL, "input": bad})
    assert r.status_code == 400
    assert r.json()["error"] == {
        "message": r.json()["error"]["message"],
        "type": "invalid_request_error",
        "param": "input",
        "code": "invalid_request",
    }


def test_token_arrays_are_accepted(gw: Gateway, key: KeyHandle) -> None:
    with gw.client(key.key) as c:
        r = c.post("/v1/embeddings", json={"model": MODEL, "input": [[1, 2, 3], [4, 5]]})
    assert r.status_code == 200
    assert r.json()["usage"]["prompt_tokens"] == 5


def test_model_of_the_wrong_type_for_the_endpoint(gw: Gateway, key: KeyHandle) -> None:
    with gw.client(key.key) as c:
        to_embeddings = c.post("/v1/embeddings", json={"model": "openai/gpt-4o-mini", "input": "x"})
        to_chat = c.post(
            "/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
        )
    for r, endpoint in ((to_embeddings, "/v1/chat/completions"), (to_chat, "/v1/embeddings")):
        assert r.status_code == 400
        error = r.json()["error"]
        assert error["code"] == "invalid_request" and error["param"] == "model"
        assert endpoint in error["message"]


def test_model_group_info_lists_the_embedding_parameters(gw: Gateway, key: KeyHandle) -> None:
    with gw.client(key.key) as c:
        info = c.get("/model_group/info", params={"model_group": MODEL}).json()["data"][0]
    assert info["supported_openai_params"] == ["dimensions", "encoding_format", "user"]
    assert info["mode"] == "embedding"

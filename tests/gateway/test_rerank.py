"""POST /v1/rerank (Shape C) with the cohere client (v1 and v2) and a plain POST."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import cohere
import httpx
import pytest

from gateway.config import Prices
from gateway.core import count_tokens
from gateway.pricing import Usage, cost
from harness import Gateway, KeyHandle, eventually

MODEL = "cohere/rerank-v3.5"
PRICES = Prices(input=Decimal("2.50"), output=Decimal(10), search=Decimal("0.002"))
DOCS = [
    "Carson City is the capital city of the American state of Nevada.",
    "Washington, D.C. is the capital of the United States.",
    "Capital punishment has existed in the United States since before it was a country.",
    "The Commonwealth of the Northern Mariana Islands is a group of islands in the Pacific Ocean.",
]
QUERY = "What is the capital of the United States?"


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=30) as client:
        yield client


def test_cohere_client_v2(gw: Gateway, key: KeyHandle, http: httpx.Client) -> None:
    co = cohere.ClientV2(api_key=key.key, base_url=gw.url, httpx_client=http)
    result = co.rerank(model=MODEL, query=QUERY, documents=DOCS, top_n=2)
    assert len(result.results) == 2
    assert result.results[0].index == 1  # the document that answers the query
    assert result.results[0].relevance_score >= result.results[1].relevance_score


def test_cohere_client_v1(gw: Gateway, key: KeyHandle, http: httpx.Client) -> None:
    co = cohere.Client(api_key=key.key, base_url=gw.url, httpx_client=http)
    result = co.rerank(model=MODEL, query=QUERY, documents=DOCS, return_documents=True)
    assert len(result.results) == len(DOCS) and result.results[0].index == 1
    scores = [r.relevance_score for r in result.results]
    assert scores == sorted(scores, reverse=True)
    assert result.results[0].document is not None and "Washington" in result.results[0].document.text


@pytest.mark.parametrize("suffix", ["", "/v1"], ids=["root", "spec-base-v1"])
@pytest.mark.parametrize("version", ["v1", "v2"])
def test_cohere_clients_from_either_base(
    gw: Gateway, key: KeyHandle, http: httpx.Client, suffix: str, version: str
) -> None:
    """Spec 1.2 gives Shape C clients {base_url}/v1; the root works too. Both cohere clients, from
    both, reach the gateway (/v1/rerank, /v2/rerank, /v1/v1/rerank, /v1/v2/rerank)."""
    client_class = cohere.ClientV2 if version == "v2" else cohere.Client
    co = client_class(api_key=key.key, base_url=gw.url + suffix, httpx_client=http)
    result = co.rerank(model=MODEL, query=QUERY, documents=DOCS, top_n=2)
    assert [r.index for r in result.results][:1] == [1]
    assert result.meta is not None and result.meta.billed_units is not None
    assert result.meta.billed_units.search_units == 1


def test_answer_carries_usage_beside_cohere_meta(gw: Gateway, key: KeyHandle) -> None:
    """Spec 1.4.1: every successful response includes usage; Cohere's meta.billed_units is kept."""
    with gw.client(key.key) as c:
        r = c.post("/v1/v2/rerank", json={"model": MODEL, "query": QUERY, "documents": DOCS})
        assert r.status_code == 200, r.text
        body = r.json()
        tokens = body["meta"]["tokens"]["input_tokens"]
        assert body["meta"]["billed_units"] == {"search_units": 1}
        assert body["usage"] == {
            "prompt_tokens": tokens,
            "completion_tokens": 0,
            "total_tokens": tokens,
            "search_units": 1,
        }
        record = _usage_record(c, body["id"])
    assert record["usage"]["prompt_tokens"] == tokens


def _usage_record(c: httpx.Client, rid: str) -> dict[str, Any]:
    def answered() -> httpx.Response | None:
        r = c.get(f"/v1/usage/{rid}")
        return None if r.status_code == 404 else r

    r = eventually(answered, what=f"the usage record {rid}")
    assert r.status_code == 200, r.text
    record: dict[str, Any] = r.json()
    return record


def test_plain_post_is_charged_per_search(gw: Gateway, key: KeyHandle) -> None:
    before = gw.balance(key.account_id)
    with gw.client(key.key) as c:
        r = c.post(
            "/v1/rerank",
            json={"model": MODEL, "query": QUERY, "documents": [{"text": d} for d in DOCS], "top_n": 1},
        )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["id"].startswith("rerank-") and [x["index"] for x in body["results"]] == [1]
    tokens = body["meta"]["tokens"]["input_tokens"]
    charged = Decimal(r.headers["x-service-cost"])
    assert charged == cost(PRICES, Usage(prompt_tokens=tokens, searches=1))
    assert gw.wait_balance(key.account_id, before - charged) == before - charged


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": MODEL, "documents": DOCS}, "query"),
        ({"model": MODEL, "query": "q", "documents": []}, "documents"),
        ({"model": MODEL, "query": "q", "documents": [1]}, "documents"),
        ({"model": MODEL, "query": "q", "documents": DOCS, "top_n": 0}, "top_n"),
        ({"model": "openai/gpt-4o-mini", "query": "q", "documents": DOCS}, "model"),
    ],
)
def test_bad_requests(gw: Gateway, key: KeyHandle, body: dict[str, object], param: str) -> None:
    with gw.client(key.key) as c:
        r = c.post("/v1/rerank", json=body)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == param and r.json()["error"]["code"] == "invalid_request"


def test_model_group_info_for_rerank(gw: Gateway, key: KeyHandle) -> None:
    with gw.client(key.key) as c:
        info = c.get("/model_group/info", params={"model_group": MODEL}).json()["data"][0]
    assert info["mode"] == "rerank"
    assert "top_n" in info["supported_openai_params"]


def test_long_documents_are_held_a_search_per_100_chunks(gw: Gateway) -> None:
    """Review: Cohere bills a document longer than 500 tokens (with the query) as one document per
    500-token chunk; the hold counted one search per 100 documents whatever their length. 100
    documents of ~600 tokens are 200 chunks, two searches: refused on what one search and the
    tokens cost, where the hold of one search would have let the upstream bill two."""
    long_docs = ["word " * 600] * 100
    tokens = sum(count_tokens(QUERY) + count_tokens(d) for d in long_docs)
    one_search = cost(PRICES, Usage(prompt_tokens=tokens, searches=1))
    assert cost(PRICES, Usage(prompt_tokens=tokens, searches=2)) > one_search + Decimal("0.001")
    handle = gw.new_key(balance=str(one_search + Decimal("0.001")))
    with gw.client(handle.key) as c:
        r = c.post("/v1/rerank", json={"model": MODEL, "query": QUERY, "documents": long_docs})
    assert r.status_code == 400 and r.json()["error"]["code"] == "insufficient_credits", r.text
    with gw.client(gw.new_key().key) as c:
        served = c.post("/v1/rerank", json={"model": MODEL, "query": QUERY, "documents": long_docs})
    assert served.status_code == 200 and served.json()["meta"]["billed_units"]["search_units"] == 2


def test_object_documents_ranked_by_their_rank_fields(
    gw: Gateway, key: KeyHandle, http: httpx.Client
) -> None:
    """Review: cohere's v1 client with object documents and `rank_fields` (a valid Cohere request)
    was refused for documents without `text`. The fields it names are what is ranked and counted,
    and `return_documents` gives each object back as it was sent."""
    before = gw.balance(key.account_id)
    documents = [{"title": f"Document {i}", "body": text, "id": str(i)} for i, text in enumerate(DOCS)]
    co = cohere.Client(api_key=key.key, base_url=gw.url, httpx_client=http)
    result = co.rerank(
        model=MODEL, query=QUERY, documents=documents, rank_fields=["body"], return_documents=True, top_n=2
    )
    assert [r.index for r in result.results][:1] == [1]
    first = result.results[0].document
    assert first is not None and first.dict()["body"] == DOCS[1] and first.dict()["id"] == "1"
    assert result.meta is not None and result.meta.billed_units is not None
    assert result.meta.billed_units.search_units == 1
    with gw.client(key.key) as c:
        record = _usage_record(c, str(result.id))
    charged = Decimal(str(record["cost"]))
    assert charged > 0 and gw.wait_balance(key.account_id, before - charged) == before - charged


@pytest.mark.parametrize(
    ("documents", "fields", "param"),
    [
        ([{"title": "a"}], [], "rank_fields"),
        ([{"title": "a"}], "title", "rank_fields"),
        ([{"title": 7}], ["title"], "documents[0].title"),
        ([{"title": "a"}, {"body": "b"}], ["title"], "documents[1]"),
    ],
)
def test_rank_fields_refusals(
    gw: Gateway, key: KeyHandle, documents: list[Any], fields: Any, param: str
) -> None:
    body = {"model": MODEL, "query": "q", "documents": documents, "rank_fields": fields}
    with gw.client(key.key) as c:
        r = c.post("/v1/rerank", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text

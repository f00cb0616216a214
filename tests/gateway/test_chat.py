"""Chat completions end to end with the official openai client: plain, streamed, ids, cost, usage."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import openai
import pytest

from gateway.config import Prices
from gateway.pricing import Usage, cost
from harness import Gateway, KeyHandle

PRICES = Prices(
    input=Decimal("2.50"), cached_input=Decimal("1.25"), output=Decimal("10.00"), reasoning=Decimal("10.00")
)


@pytest.fixture
def oai(gw: Gateway, key: KeyHandle) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gw.openai_base, api_key=key.key, max_retries=0) as c:
        yield c


def test_plain_completion_with_openai_client(gw: Gateway, key: KeyHandle, oai: openai.OpenAI) -> None:
    raw = oai.chat.completions.with_raw_response.create(
        model="openai/gpt-4o-mini", messages=[{"role": "user", "content": "Say hello"}], max_tokens=5
    )
    completion = raw.parse()
    assert completion.choices[0].message.content
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None and completion.usage.completion_tokens == 5
    assert completion.id.startswith("chatcmpl-")
    request_id = raw.headers["x-service-request-id"]
    assert request_id.startswith("req_") and request_id != completion.id
    expected = cost(PRICES, Usage(completion.usage.prompt_tokens, completion.usage.completion_tokens))
    assert Decimal(raw.headers["x-service-cost"]) == expected


def test_charge_equals_cost_header_and_usage_record(gw: Gateway, key: KeyHandle, oai: openai.OpenAI) -> None:
    before = gw.balance(key.account_id)
    raw = oai.chat.completions.with_raw_response.create(
        model="openai/gpt-4o-mini", messages=[{"role": "user", "content": "count to three"}]
    )
    completion = raw.parse()
    charged = Decimal(raw.headers["x-service-cost"])
    assert charged > 0
    assert gw.wait_balance(key.account_id, before - charged) == before - charged

    body = gw.usage_record(key.key, completion.id)
    assert body["id"] == completion.id
    assert body["model"] == "openai/gpt-4o-mini"
    assert body["status"] == "completed"
    assert Decimal(str(body["cost"])) == charged
    assert completion.usage is not None
    assert body["usage"] == {
        "prompt_tokens": completion.usage.prompt_tokens,
        "completion_tokens": completion.usage.completion_tokens,
        "total_tokens": completion.usage.total_tokens,
    }
    assert body["duration_ms"] >= 0
    assert body["started_at"].endswith("Z") and body["ended_at"] >= body["started_at"]


def test_usage_lookup_is_scoped_to_the_key(gw: Gateway, key: KeyHandle, oai: openai.OpenAI) -> None:
    completion = oai.chat.completions.create(
        model="openai/gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
    )
    gw.usage_record(key.key, completion.id)
    other = gw.new_key()
    with gw.client(other.key) as c:
        r = c.get(f"/v1/usage/{completion.id}")
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "not_found"
    # The request id header is not what the lookup takes.
    with gw.client(key.key) as c:
        assert c.get("/v1/usage/req_doesnotexist").status_code == 404


def test_streamed_completion_same_id_on_every_chunk(gw: Gateway, key: KeyHandle, oai: openai.OpenAI) -> None:
    stream = oai.chat.completions.create(
        model="openai/gpt-4o-mini",
        messages=[{"role": "user", "content": "stream please [sim tokens=12]"}],
        stream=True,
    )
    chunks = list(stream)
    ids = {c.id for c in chunks}
    assert len(ids) == 1 and next(iter(ids)).startswith("chatcmpl-")
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 12
    # Without include_usage the client sees no usage chunk, although the gateway asked for one upstream.
    assert all(c.usage is None for c in chunks)
    assert all(c.choices for c in chunks)


def test_usage_record_answers_the_moment_a_stream_ends(
    gw: Gateway, key: KeyHandle, oai: openai.OpenAI
) -> None:
    """Streams carry no cost header: their users ask /v1/usage/{id} as soon as the stream ends (spec
    4, note 3), before the settlement's group commit has necessarily been applied."""
    with gw.client(key.key) as c:
        for n in range(10):
            stream = oai.chat.completions.create(
                model="openai/gpt-4o-mini",
                messages=[{"role": "user", "content": f"usage at once {n} [sim tokens=3]"}],
                stream=True,
            )
            usage_id = [chunk.id for chunk in stream][-1]
            r = c.get(f"/v1/usage/{usage_id}")
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] == 3


def test_stream_include_usage_last_chunk_and_billing(gw: Gateway, key: KeyHandle, oai: openai.OpenAI) -> None:
    before = gw.balance(key.account_id)
    with oai.chat.completions.with_streaming_response.create(
        model="openai/gpt-4o-mini",
        messages=[{"role": "user", "content": "with usage [sim tokens=7]"}],
        stream=True,
        stream_options={"include_usage": True},
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        assert "x-service-cost" not in response.headers
        assert response.headers["x-service-request-id"].startswith("req_")
        chunks = list(response.parse())
    last = chunks[-1]
    assert last.usage is not None and last.usage.completion_tokens == 7
    assert last.choices == []
    assert all(c.usage is None for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1

    record = gw.usage_record(key.key, last.id)
    assert record["usage"]["completion_tokens"] == 7
    expected = cost(PRICES, Usage(last.usage.prompt_tokens, 7))
    assert Decimal(str(record["cost"])) == expected
    assert gw.wait_balance(key.account_id, before - expected) == before - expected


def test_raw_stream_ends_with_done(gw: Gateway, key: KeyHandle) -> None:
    with (
        gw.client(key.key) as c,
        c.stream(
            "POST",
            "/v1/chat/completions",
            json={
                "model": "openai/gpt-4o-mini",
                "messages": [{"role": "user", "content": "x [sim tokens=3]"}],
                "stream": True,
            },
        ) as r,
    ):
        body = b"".join(r.iter_bytes())
    events = [e for e in body.split(b"\n\n") if e]
    assert all(e.startswith(b"data: ") for e in events)
    assert events[-1] == b"data: [DONE]"


@pytest.mark.parametrize("model", ["openai/gpt-4o-mini", "meta/llama-3.1-8b"])
def test_models_list_with_openai_client(gw: Gateway, key: KeyHandle, model: str, oai: openai.OpenAI) -> None:
    models = oai.models.list()
    assert model in {m.id for m in models.data}


def test_one_model_with_openai_client(oai: openai.OpenAI) -> None:
    """GET /v1/models/{model}: the list's entry, the name's slash included."""
    listed = {m.id: m for m in oai.models.list().data}
    assert oai.models.retrieve("openai/gpt-4o-mini") == listed["openai/gpt-4o-mini"]
    with pytest.raises(openai.BadRequestError) as info:
        oai.models.retrieve("no/such-model")
    assert info.value.code == "model_not_found"


@pytest.mark.parametrize("stream", [False, True])
def test_an_upstream_that_counts_nothing_still_gives_the_client_its_usage(
    gw: Gateway, key: KeyHandle, oai: openai.OpenAI, stream: bool
) -> None:
    """Review: an upstream that reports no usage (an OpenAI-compatible server that counts nothing,
    or one that takes no stream_options) was billed the gateway's count, but the client got no
    usage: spec 1.4.1 (every successful response includes usage) and 6.1.4 (include_usage's last
    chunk). The client now sees the count it is billed."""
    before = gw.balance(key.account_id)
    messages: Any = [{"role": "user", "content": "uncounted [sim tokens=5 no_usage]"}]
    completion: Any
    if stream:
        with oai.chat.completions.stream(
            model="openai/gpt-4o-mini", messages=messages, stream_options={"include_usage": True}
        ) as events:
            chunks = [e.chunk for e in events if e.type == "chunk"]
            completion = events.get_final_completion()
        assert chunks[-1].choices == [] and chunks[-1].usage is not None
        assert all(c.usage is None for c in chunks[:-1]) and {c.id for c in chunks} == {completion.id}
    else:
        completion = oai.chat.completions.create(model="openai/gpt-4o-mini", messages=messages)
    usage = completion.usage
    assert usage is not None and usage.completion_tokens == 5 and usage.prompt_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + 5
    record = gw.usage_record(key.key, completion.id)
    assert record["usage"]["prompt_tokens"] == usage.prompt_tokens
    assert record["usage"]["completion_tokens"] == 5
    expected = cost(PRICES, Usage(usage.prompt_tokens, 5))
    assert gw.wait_balance(key.account_id, before - expected) == before - expected


@pytest.mark.parametrize("counted", [True, False])
def test_a_stream_that_ends_without_done_after_its_finish_chunk_is_whole(
    gw: Gateway, key: KeyHandle, oai: openai.OpenAI, counted: bool
) -> None:
    """Review: an OpenAI-compatible upstream that ends its stream after the finish (and usage)
    chunk without `data: [DONE]` got an error event after the whole answer, and was billed as
    incomplete from the gateway's own count; through /v1/messages and /v1/responses the same
    upstream was whole. The client gets its [DONE] (after the gateway's usage chunk when the
    upstream counted nothing), and the upstream's usage is billed."""
    before = gw.balance(key.account_id)
    uncounted = "" if counted else " no_usage"
    messages: Any = [{"role": "user", "content": f"x [sim tokens=4 no_done{uncounted}]"}]
    with oai.chat.completions.stream(
        model="openai/gpt-4o-mini", messages=messages, stream_options={"include_usage": True}
    ) as events:
        chunks = [e.chunk for e in events if e.type == "chunk"]
        completion = events.get_final_completion()
    assert completion.choices[0].finish_reason == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4
    record = gw.usage_record(key.key, completion.id)
    assert record["status"] == "completed" and record["usage"]["completion_tokens"] == 4
    expected = cost(PRICES, Usage(record["usage"]["prompt_tokens"], 4))
    assert gw.wait_balance(key.account_id, before - expected) == before - expected
    body = {"model": "openai/gpt-4o-mini", "messages": messages, "stream": True}
    with gw.client(key.key) as c, c.stream("POST", "/v1/chat/completions", json=body) as r:
        raw = [e for e in b"".join(r.iter_bytes()).split(b"\n\n") if e]
    assert raw[-1] == b"data: [DONE]" and b'"error"' not in b"".join(raw)


def test_a_stream_that_did_not_ask_for_usage_gets_none_from_an_upstream_that_counts_nothing(
    gw: Gateway, key: KeyHandle
) -> None:
    body = {
        "model": "openai/gpt-4o-mini",
        "messages": [{"role": "user", "content": "x [sim tokens=3 no_usage]"}],
        "stream": True,
    }
    with gw.client(key.key) as c, c.stream("POST", "/v1/chat/completions", json=body) as r:
        events = [e for e in b"".join(r.iter_bytes()).split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]" and not any(b'"usage":{' in e for e in events)

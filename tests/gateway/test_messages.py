"""POST /v1/messages (Shape B) with the official anthropic client, plain and streamed."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from decimal import Decimal

import anthropic
import httpx
import pytest

from gateway.config import Prices
from gateway.pricing import Usage, cost
from harness import Gateway, KeyHandle, eventually, sim_requests

MODEL = "anthropic/claude-sonnet-4-5"
PRICES = Prices(
    input=Decimal("2.50"), cached_input=Decimal("1.25"), output=Decimal(10), reasoning=Decimal(10)
)


@pytest.fixture
def claude(gw: Gateway, key: KeyHandle) -> Iterator[anthropic.Anthropic]:
    # The anthropic client takes the gateway's root and adds /v1 itself; it sends x-api-key.
    with anthropic.Anthropic(base_url=gw.url, api_key=key.key, max_retries=0) as c:
        yield c


def test_plain_message_with_the_anthropic_client(
    gw: Gateway, key: KeyHandle, claude: anthropic.Anthropic
) -> None:
    before = gw.balance(key.account_id)
    raw = claude.messages.with_raw_response.create(
        model=MODEL, max_tokens=6, messages=[{"role": "user", "content": "Hello"}]
    )
    message = raw.parse()
    assert message.id.startswith("msg_")
    assert message.content[0].type == "text" and len(message.content[0].text.split()) == 6
    assert message.stop_reason == "max_tokens"
    assert message.usage.output_tokens == 6
    charged = Decimal(raw.headers["x-service-cost"])
    assert charged == cost(PRICES, Usage(message.usage.input_tokens, message.usage.output_tokens))
    assert raw.headers["x-service-request-id"].startswith("req_")
    assert gw.wait_balance(key.account_id, before - charged) == before - charged


def test_a_message_whose_upstream_counted_nothing_carries_the_gateways_count(
    gw: Gateway, key: KeyHandle, claude: anthropic.Anthropic
) -> None:
    """Spec 1.4.1: every successful response includes usage; where the upstream reported none, the
    gateway's count, the one billed."""
    raw = claude.messages.with_raw_response.create(
        model=MODEL, max_tokens=50, messages=[{"role": "user", "content": "x [sim tokens=4 no_usage]"}]
    )
    message = raw.parse()
    assert message.usage.output_tokens == 4 and message.usage.input_tokens > 0
    record = gw.usage_record(key.key, message.id)
    assert record["usage"]["prompt_tokens"] == message.usage.input_tokens
    assert record["usage"]["completion_tokens"] == 4
    assert Decimal(raw.headers["x-service-cost"]) == cost(PRICES, Usage(message.usage.input_tokens, 4))


def test_streamed_message_with_the_anthropic_client(
    gw: Gateway, key: KeyHandle, claude: anthropic.Anthropic
) -> None:
    with claude.messages.stream(
        model=MODEL, max_tokens=100, messages=[{"role": "user", "content": "Stream [sim tokens=9]"}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert len(text.split()) == 9
    assert final.id.startswith("msg_")
    assert final.usage.output_tokens == 9
    assert final.stop_reason == "end_turn"

    with gw.client(key.key) as c:
        deadline = time.monotonic() + 5
        while (r := c.get(f"/v1/usage/{final.id}")).status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert r.status_code == 200
    assert r.json()["usage"]["completion_tokens"] == 9
    assert r.json()["status"] == "completed"


def raw_stream(gw: Gateway, key: KeyHandle, content: str) -> list[tuple[str | None, str]]:
    body = {
        "model": MODEL,
        "max_tokens": 50,
        "stream": True,
        "messages": [{"role": "user", "content": content}],
    }
    with gw.client(key.key) as c, c.stream("POST", "/v1/messages", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        text = b"".join(r.iter_bytes()).decode()
    events = []
    for block in text.strip().split("\n\n"):
        name = None
        data = ""
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                data = line.removeprefix("data: ")
        events.append((name, data))
    return events


def test_stream_keeps_event_names_same_id_everywhere_and_ends_with_done(gw: Gateway, key: KeyHandle) -> None:
    events = raw_stream(gw, key, "x [sim tokens=3]")
    assert events[0][0] == "message_start"
    assert events[-2][0] == "message_stop"
    assert events[-1] == (None, "[DONE]")
    ids = {httpx.Response(200, content=data).json()["id"] for name, data in events[:-1]}
    assert len(ids) == 1 and next(iter(ids)).startswith("msg_")
    start = httpx.Response(200, content=events[0][1]).json()
    assert start["message"]["id"] in ids


def test_stream_error_after_start_is_a_final_error_event(
    gw: Gateway, key: KeyHandle, claude: anthropic.Anthropic
) -> None:
    events = raw_stream(gw, key, "x [sim tokens=8 error_after=2]")
    name, data = events[-1]
    assert name == "error"
    assert httpx.Response(200, content=data).json()["error"]["code"] == "provider_error"
    with (
        pytest.raises(anthropic.APIStatusError),
        claude.messages.stream(
            model=MODEL,
            max_tokens=50,
            messages=[{"role": "user", "content": "x [sim tokens=8 error_after=2]"}],
        ) as stream,
    ):
        for _ in stream.text_stream:
            pass


def test_bearer_works_too_and_a_bad_x_api_key_is_401(gw: Gateway, key: KeyHandle) -> None:
    body = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    with gw.client(key.key) as c:
        assert c.post("/v1/messages", json=body).status_code == 200
    r = httpx.post(gw.url + "/v1/messages", json=body, headers={"x-api-key": "sk-nope"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    with (
        anthropic.Anthropic(base_url=gw.url, api_key="sk-nope", max_retries=0) as bad,
        pytest.raises(anthropic.AuthenticationError),
    ):
        bad.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "hi"}])


def test_spec_example_top_k_reaches_this_family_and_logit_bias_is_dropped(
    gw: Gateway, key: KeyHandle, sim: httpx.Client
) -> None:
    marker = "marker-" + os.urandom(6).hex()
    body = {
        "model": MODEL,
        "max_tokens": 5,
        "messages": [{"role": "user", "content": marker}],
        "top_k": 7,
        "logit_bias": {"1": 2},
        "system": "be brief",
    }
    with gw.client(key.key) as c:
        r = c.post("/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"})
    assert r.status_code == 200, r.text
    (received,) = sim_requests(sim, marker)
    assert received["top_k"] == 7 and received["system"] == "be brief" and received["max_tokens"] == 5
    assert "logit_bias" not in received
    assert received["model"] == "claude-sonnet-4-5"
    entry = next(
        e for e in sim.get("/_sim/requests").json() if e["body"] is not None and marker in str(e["body"])
    )
    assert entry["anthropic-version"] == "2023-06-01"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        ({"model": MODEL, "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        ({"model": MODEL, "max_tokens": 5, "messages": []}, "messages"),
        (
            {
                "model": "openai/text-embedding-3-small",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "x"}],
            },
            "model",
        ),
    ],
)
def test_bad_requests(gw: Gateway, key: KeyHandle, body: dict[str, object], param: str) -> None:
    with gw.client(key.key) as c:
        r = c.post("/v1/messages", json=body)
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "invalid_request" and r.json()["error"]["param"] == param


def test_upstream_overloaded_and_failing(gw: Gateway, key: KeyHandle) -> None:
    with gw.client(key.key) as c:
        for directive, status, code in (
            ("fail=429", 429, "provider_overloaded"),
            ("fail=529", 429, "provider_overloaded"),  # Anthropic's overloaded_error
            ("fail=500", 502, "provider_error"),
        ):
            body = {
                "model": MODEL,
                "max_tokens": 5,
                "messages": [{"role": "user", "content": f"[sim {directive}]"}],
            }
            r = c.post("/v1/messages", json=body)
            assert r.status_code == status and r.json()["error"]["code"] == code
            if status == 429:  # the spec's type, Anthropic's word for a 429 (LiteLLM's RateLimitError)
                assert r.json()["error"]["type"] == "rate_limit_error"


def test_count_tokens_is_the_gateways_own_count_and_free(
    gw: Gateway, key: KeyHandle, claude: anthropic.Anthropic
) -> None:
    """POST /v1/messages/count_tokens (the anthropic client's messages.count_tokens) counts the
    prompt as the gateway counts it for a hold (so does the simulator: the message's input_tokens),
    sends nothing upstream and charges nothing."""
    system = "Answer in one word."
    messages: list[anthropic.types.MessageParam] = [
        {"role": "user", "content": "Name a colour " + os.urandom(4).hex()}
    ]
    before = gw.balance(key.account_id)
    counted = claude.messages.count_tokens(model=MODEL, system=system, messages=messages)
    time.sleep(0.2)  # a charge, if there were one, would have landed by now
    assert gw.balance(key.account_id) == before
    message = claude.messages.create(model=MODEL, max_tokens=3, system=system, messages=messages)
    assert counted.input_tokens == message.usage.input_tokens > 0
    with gw.client(key.key) as c:
        missing = c.post("/v1/messages/count_tokens", json={"model": MODEL})
        unknown = c.post("/v1/messages/count_tokens", json={"model": "no/such", "messages": messages})
    assert (missing.status_code, missing.json()["error"]["param"]) == (400, "messages")
    assert (unknown.status_code, unknown.json()["error"]["code"]) == (400, "model_not_found")
    # A model request like any other: it has its request id, its log entry names the model, and
    # an account at zero is refused (spec 7.5.1: free models too).
    with gw.client(key.key) as c:
        answered = c.post("/v1/messages/count_tokens", json={"model": MODEL, "messages": messages})
    rid = answered.headers["x-service-request-id"]
    logged = eventually(
        lambda: gw.query("SELECT model FROM request_logs WHERE id = ?", rid), what="its entry"
    )
    assert [tuple(row) for row in logged] == [(MODEL,)]
    broke = gw.new_key(balance="0")
    with gw.client(broke.key) as c:
        refused = c.post("/v1/messages/count_tokens", json={"model": MODEL, "messages": messages})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "insufficient_credits"


def test_a_base_url_given_with_v1_works_too(gw: Gateway, key: KeyHandle) -> None:
    """The anthropic client (and LiteLLM's `anthropic/` models) add /v1/messages to the base URL
    they are given: one given with /v1 reaches the same endpoints."""
    with anthropic.Anthropic(base_url=gw.url + "/v1", api_key=key.key, max_retries=0) as c:
        message = c.messages.create(model=MODEL, max_tokens=3, messages=[{"role": "user", "content": "Hi"}])
        counted = c.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "Hi"}])
    assert message.usage.output_tokens == 3
    assert counted.input_tokens == message.usage.input_tokens
    # Its errors are Anthropic's too, as under /v1/messages.
    with gw.client(key.key) as http:
        for path in (
            "/v1/v1/messages",
            "/v1/v1/messages/count_tokens",
            "/messages",
            "/messages/count_tokens",
        ):
            refused = http.post(path, json={"model": MODEL, "messages": []})
            assert refused.status_code == 400 and refused.json()["type"] == "error", path
            assert refused.json()["error"]["type"] == "invalid_request_error"


def test_the_anthropic_clients_models_list_and_retrieve(
    gw: Gateway, key: KeyHandle, claude: anthropic.Anthropic
) -> None:
    """The anthropic client's models API (it sends anthropic-version): Anthropic's model objects,
    paged as Anthropic pages them, and a bare name is Anthropic's model of that name."""
    names = [m.id for m in claude.models.list(limit=3)]  # auto-paging through has_more / last_id
    with gw.client(key.key) as c:
        assert names == [m["id"] for m in c.get("/v1/models").json()["data"]]
    assert len(names) > 3 and MODEL in names
    first = claude.models.list(limit=2)
    assert [m.id for m in first.data] == names[:2] and first.has_more and first.last_id == names[1]
    later = claude.models.list(limit=2, after_id=names[1])
    assert [m.id for m in later.data] == names[2:4]
    assert [m.id for m in claude.models.list(limit=1, before_id=names[2]).data] == [names[1]]
    model = claude.models.retrieve("claude-sonnet-4-5")
    assert (model.id, model.type, model.display_name) == (MODEL, "model", MODEL)
    with pytest.raises(anthropic.BadRequestError):
        claude.models.list(limit=0)
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.models.retrieve("no-such-model")
    assert isinstance(caught.value.body, dict) and caught.value.body["error"]["code"] == "model_not_found"

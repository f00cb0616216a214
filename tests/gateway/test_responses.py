"""POST /v1/responses with the official openai client: plain, streamed, stateful across turns (and
on the channel holding the state), hosted tools passed through."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path

import httpx
import openai
import orjson
import pytest
from openai.types.responses import FunctionToolParam

from gateway.config import Prices
from gateway.pricing import Usage, cost
from gateway.store import ResponseState
from gateway.store.sqlite import SqliteStore
from harness import Gateway, KeyHandle, eventually, free_port, gateway, running

MODEL = "openai/gpt-4.1-mini"
PRICES = Prices(
    input=Decimal("2.50"), cached_input=Decimal("1.25"), output=Decimal(10), reasoning=Decimal(10)
)


@pytest.fixture
def oai(gw: Gateway, key: KeyHandle) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gw.openai_base, api_key=key.key, max_retries=0) as c:
        yield c


def received(sim: httpx.Client, marker: str) -> list[dict[str, object]]:
    """Responses bodies the simulator received whose input mentions `marker`."""
    return [
        e["body"]
        for e in sim.get("/_sim/requests").json()
        if e["path"] == "/v1/responses" and marker in str(e["body"].get("input"))
    ]


def test_plain_response_billed_from_its_usage(gw: Gateway, key: KeyHandle, oai: openai.OpenAI) -> None:
    before = gw.balance(key.account_id)
    raw = oai.responses.with_raw_response.create(model=MODEL, input="Hello [sim tokens=7 reasoning=3]")
    response = raw.parse()
    assert response.id.startswith("resp_") and response.status == "completed"
    assert len(response.output_text.split()) == 7
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert response.usage is not None and response.usage.output_tokens_details.reasoning_tokens > 0
    usage = Usage(
        prompt_tokens=response.usage.input_tokens,
        completion_tokens=response.usage.output_tokens,
        reasoning_tokens=response.usage.output_tokens_details.reasoning_tokens,
    )
    charged = Decimal(raw.headers["x-service-cost"])
    assert charged == cost(PRICES, usage) > 0
    assert gw.wait_balance(key.account_id, before - charged) == before - charged
    with gw.client(key.key) as c:
        deadline = time.monotonic() + 5
        while (r := c.get(f"/v1/usage/{response.id}")).status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert r.status_code == 200
    assert r.json()["usage"]["completion_tokens"] == response.usage.output_tokens


def test_stream_helper_final_response(oai: openai.OpenAI) -> None:
    with oai.responses.stream(model=MODEL, input="Stream [sim tokens=9]") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert len(deltas) == 9 and "".join(deltas) == final.output_text
    assert final.id.startswith("resp_") and final.status == "completed"
    assert final.usage is not None and final.usage.output_tokens > 0


def test_raw_stream_same_id_everywhere_and_ends_with_done(gw: Gateway, key: KeyHandle) -> None:
    with (
        gw.client(key.key) as c,
        c.stream(
            "POST", "/v1/responses", json={"model": MODEL, "input": "ids [sim tokens=4]", "stream": True}
        ) as r,
    ):
        assert r.headers["content-type"].startswith("text/event-stream")
        data = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    events = [orjson.loads(d) for d in data[:-1]]
    rid = events[0]["response"]["id"]
    assert rid.startswith("resp_")
    assert all(e["id"] == rid for e in events)
    assert all(e["response"]["id"] == rid for e in events if "response" in e)
    assert events[-1]["type"] == "response.completed"


def test_conversation_continues_with_previous_response_id(oai: openai.OpenAI, sim: httpx.Client) -> None:
    marker = "turn " + os.urandom(4).hex()
    first = oai.responses.create(model=MODEL, input=f"{marker} one")
    second = oai.responses.create(model=MODEL, input=f"{marker} two", previous_response_id=first.id)
    assert second.previous_response_id == first.id  # the client sees gateway ids only
    assert second.usage is not None and first.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens  # the first turn is in the context
    upstream_first, upstream_second = received(sim, marker)
    assert "previous_response_id" not in upstream_first
    upstream_id = upstream_second["previous_response_id"]
    assert isinstance(upstream_id, str) and upstream_id.startswith("resp_") and upstream_id != first.id


def test_turns_continuing_a_long_conversation_at_once_hold_it_and_never_overspend(gw: Gateway) -> None:
    """A turn holds the conversation its upstream reads again (the earlier response's prompt and
    output, as charged), not only its own input: twelve turns at once on a 40k-token conversation
    are admitted only as far as the balance goes (review: all twelve ran, each on a few tokens'
    hold, and took the balance $0.32 below zero)."""
    key = gw.new_key("0.5")
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key=key.key, max_retries=0)
    first = client.responses.create(model=MODEL, input="word " * 40_000, max_output_tokens=16)
    assert first.usage is not None and first.usage.input_tokens >= 40_000
    eventually(lambda: gw.balance(key.account_id) < Decimal("0.5"), 10, 0.05, what="the first turn charged")
    after_first = gw.balance(key.account_id)

    def turn(i: int) -> httpx.Response:
        return httpx.post(
            gw.url + "/v1/responses",
            json={
                "model": MODEL,
                "input": f"next {i}",
                "previous_response_id": first.id,
                "max_output_tokens": 16,
            },
            headers={"authorization": f"Bearer {key.key}"},
            timeout=60,
        )

    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(turn, range(12)))
    ran = [a for a in answers if a.status_code == 200]
    refused = [a for a in answers if a.status_code != 200]
    assert all(a.status_code == 400 and a.json()["error"]["code"] == "insufficient_credits" for a in refused)
    each = Decimal(ran[0].headers["x-service-cost"])
    assert 1 <= len(ran) <= after_first // each
    eventually(
        lambda: (
            gw.balance(key.account_id) == after_first - sum(Decimal(a.headers["x-service-cost"]) for a in ran)
        ),
        10,
        0.05,
        what="every turn charged",
    )
    assert gw.balance(key.account_id) >= 0


def test_a_turn_sent_as_the_last_one_answers_holds_the_conversation_too(gw: Gateway) -> None:
    """The state an upstream-kept response leaves says what a turn continuing it makes the upstream
    read (its prompt and output; its output limit until a stream ends), written before its answer
    goes out: a client that sends each turn the moment the last one answered, before that turn's
    charge is recorded, is held for the whole conversation too, and never takes the balance below
    zero (review: it did, in 3 runs of 5)."""
    key = gw.new_key("0.05")
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key=key.key, max_retries=0)
    plain = client.responses.create(model=MODEL, input="word " * 2000, max_output_tokens=16)
    assert plain.usage is not None
    context = gw.query("SELECT context_tokens FROM response_states WHERE id = ?", plain.id)
    assert context == [(plain.usage.input_tokens + plain.usage.output_tokens,)]
    with client.responses.stream(
        model=MODEL, input="more", previous_response_id=plain.id, max_output_tokens=20
    ) as stream:
        streamed = stream.get_final_response()
    ((bound,),) = gw.query("SELECT context_tokens FROM response_states WHERE id = ?", streamed.id)
    assert bound >= context[0][0] + 20  # the conversation before it, and its output limit
    previous, refused = streamed.id, None
    for i in range(200):  # each turn as soon as the last one has answered
        try:
            previous = client.responses.create(
                model=MODEL, input=f"next {i}", previous_response_id=previous, max_output_tokens=16
            ).id
        except openai.BadRequestError as exc:
            refused = exc
            break
    assert refused is not None and refused.code == "insufficient_credits"
    eventually(lambda: not gw.query("SELECT 1 FROM leases"), 10, 0.05, what="every hold closed")
    assert gw.balance(key.account_id) >= 0


def test_streamed_turn_can_be_continued(oai: openai.OpenAI) -> None:
    with oai.responses.stream(model=MODEL, input="first, streamed") as stream:
        first = stream.get_final_response()
    second = oai.responses.create(model=MODEL, input="second", previous_response_id=first.id)
    assert second.status == "completed" and second.previous_response_id == first.id


def test_unknown_foreign_and_unstored_previous_ids_are_refused(gw: Gateway, oai: openai.OpenAI) -> None:
    check_unknown_foreign_and_unstored_refused(gw, oai, MODEL)


def check_unknown_foreign_and_unstored_refused(
    gw: Gateway, oai: openai.OpenAI, model: str
) -> tuple[openai.types.responses.Response, openai.types.responses.Response]:
    """An unknown previous id, one made with store false, and another account's are 400 "not
    found" (as OpenAI answers); returns the unkept response and the kept one."""
    unstored = oai.responses.create(model=model, input="not kept", store=False)
    kept = oai.responses.create(model=model, input="kept")
    other = gw.new_key()
    with openai.OpenAI(base_url=gw.openai_base, api_key=other.key, max_retries=0) as stranger:
        for client, previous in ((oai, "resp_nope"), (oai, unstored.id), (stranger, kept.id)):
            with pytest.raises(openai.BadRequestError) as err:
                client.responses.create(model=model, input="next", previous_response_id=previous)
            assert err.value.code == "invalid_request"
            assert isinstance(err.value.body, dict) and err.value.body["param"] == "previous_response_id"
            assert "not found" in err.value.message
    return unstored, kept


def test_hosted_tool_passed_through_and_echoed(oai: openai.OpenAI, sim: httpx.Client) -> None:
    marker = "search " + os.urandom(4).hex()
    response = oai.responses.create(model=MODEL, input=marker, tools=[{"type": "web_search"}])
    assert [item.type for item in response.output] == ["web_search_call", "message"]
    assert [tool.type for tool in response.tools] == ["web_search"]
    (body,) = received(sim, marker)
    assert body["tools"] == [{"type": "web_search"}]


def test_unsupported_parameters_dropped(gw: Gateway, key: KeyHandle, sim: httpx.Client) -> None:
    marker = "params " + os.urandom(4).hex()
    request = {
        "model": MODEL,
        "input": marker,
        "temperature": 0.5,
        "max_output_tokens": 50,
        "top_k": 3,
        "logit_bias": {"1": 2},
        "seed": 7,
    }
    with gw.client(key.key) as c:
        r = c.post("/v1/responses", json=request)
    assert r.status_code == 200, r.text
    (body,) = received(sim, marker)
    assert body == {"model": "gpt-4.1-mini", "input": marker, "temperature": 0.5, "max_output_tokens": 50}


def test_error_after_start_is_a_final_error_event(gw: Gateway, key: KeyHandle) -> None:
    with (
        gw.client(key.key) as c,
        c.stream(
            "POST",
            "/v1/responses",
            json={"model": MODEL, "input": "[sim tokens=8 error_after=3]", "stream": True},
        ) as r,
    ):
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line]
    assert lines[-2] == "event: error"
    assert orjson.loads(lines[-1][6:])["error"]["code"] == "provider_error"
    assert sum(1 for line in lines if "response.output_text.delta" in line and line.startswith("data")) == 3


def test_failure_before_start_is_plain_error(gw: Gateway, key: KeyHandle) -> None:
    with gw.client(key.key) as c:
        plain = c.post("/v1/responses", json={"model": MODEL, "input": "[sim fail=503]"})
        streamed = c.post("/v1/responses", json={"model": MODEL, "input": "[sim fail=500]", "stream": True})
    assert plain.status_code == 503 and plain.json()["error"]["code"] == "provider_error"
    assert streamed.status_code == 502 and streamed.json()["error"]["code"] == "provider_error"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": MODEL}, "input"),
        ({"model": MODEL, "input": 5}, "input"),
        ({"model": MODEL, "input": ["text"]}, "input"),
        ({"model": MODEL, "input": "x", "previous_response_id": 7}, "previous_response_id"),
        ({"model": MODEL, "input": "x", "stream": "yes"}, "stream"),
        # A chat model is served here through translation (test_responses_translation); others are not.
        ({"model": "openai/text-embedding-3-small", "input": "x"}, "model"),
    ],
)
def test_bad_requests(gw: Gateway, key: KeyHandle, body: dict[str, object], param: str) -> None:
    with gw.client(key.key) as c:
        r = c.post("/v1/responses", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "invalid_request" and r.json()["error"]["param"] == param


# ---------------------------------------------------------------- the channel that holds the state


@pytest.fixture(scope="module")
def two_upstreams(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, str, str]]:
    """A gateway in front of two simulators: `solo` on A, `pair` on B then A, `elsewhere` on B only."""
    port_a, port_b = free_port(), free_port()
    url_a, url_b = f"http://127.0.0.1:{port_a}", f"http://127.0.0.1:{port_b}"

    def model(name: str, *bases: str) -> str:
        channels = "".join(
            f'[[models.channels]]\nprovider = "openai"\nbase_url = "{b}/v1"\nmodel = "gpt-4.1"\n'
            for b in bases
        )
        return f'[[models]]\nname = "{name}"\ntype = "responses"\n[models.prices]\ninput = "1"\n{channels}'

    models = model("test/solo", url_a) + model("test/pair", url_b, url_a) + model("test/elsewhere", url_b)
    tmp: Path = tmp_path_factory.mktemp("channels")
    with (
        running(["sim", "--port", str(port_a)], port_a),
        running(["sim", "--port", str(port_b)], port_b),
        gateway(tmp, models) as g,
    ):
        yield g, url_a, url_b


def test_next_turn_goes_to_the_channel_holding_the_state(two_upstreams: tuple[Gateway, str, str]) -> None:
    gw, url_a, url_b = two_upstreams
    handle = gw.new_key()
    with openai.OpenAI(base_url=gw.openai_base, api_key=handle.key, max_retries=0) as client:
        first = client.responses.create(model="test/solo", input="on A")
        # `pair` would go to B first; the state lives on A, so the turn goes to A.
        second = client.responses.create(model="test/pair", input="follow up", previous_response_id=first.id)
        assert second.previous_response_id == first.id
        with pytest.raises(openai.BadRequestError) as err:
            client.responses.create(model="test/elsewhere", input="lost", previous_response_id=first.id)
        assert isinstance(err.value.body, dict) and err.value.body["param"] == "previous_response_id"
    with httpx.Client() as c:
        on_a = [e["body"].get("input") for e in c.get(url_a + "/_sim/requests").json()]
        on_b = [e["body"].get("input") for e in c.get(url_b + "/_sim/requests").json()]
    assert on_a == ["on A", "follow up"]
    assert on_b == []


def test_expired_states_are_not_found_and_purged(tmp_path: Path) -> None:
    async def go() -> tuple[bool, bool, int, bool]:
        store = SqliteStore(tmp_path / "s.db")
        await store.start()
        try:
            for rid, expires in (("resp_old", 1_000), ("resp_new", 3_000)):
                await store.remember_response(
                    ResponseState(rid, "acct", MODEL, "http://u", "up_" + rid, expires)
                )
            expired = await store.find_response("resp_old", "acct", 2_000) is None
            foreign = await store.find_response("resp_new", "other", 2_000) is None
            purged = await store.purge_responses(2_000)
            kept = await store.find_response("resp_new", "acct", 2_000) is not None
            return expired, foreign, purged, kept
        finally:
            await store.close()

    assert asyncio.run(go()) == (True, True, 1, True)


WEATHER: FunctionToolParam = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "strict": True,  # the API's default, spelled out as the SDK's type asks
}


def test_function_call_plain_and_streamed(oai: openai.OpenAI) -> None:
    plain = oai.responses.create(
        model=MODEL, input="Weather in Paris?", tools=[WEATHER], tool_choice="required"
    )
    (call,) = plain.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert list(orjson.loads(call.arguments)) == ["city"]
    with oai.responses.stream(model=MODEL, input="Weather? [sim tool]", tools=[WEATHER]) as stream:
        fragments = [e.delta for e in stream if e.type == "response.function_call_arguments.delta"]
        final = stream.get_final_response()
    (streamed,) = final.output
    assert streamed.type == "function_call" and len(fragments) > 1
    assert "".join(fragments) == streamed.arguments
    # The tool's result goes back in the next turn, on the same conversation.
    answer = oai.responses.create(
        model=MODEL,
        previous_response_id=final.id,
        input=[{"type": "function_call_output", "call_id": streamed.call_id, "output": '{"temp": 21}'}],
    )
    assert answer.output_text and answer.previous_response_id == final.id


@pytest.mark.parametrize("stream", [False, True])
def test_a_response_its_upstream_keeps_is_fetched_under_the_gateways_id(
    gw: Gateway, oai: openai.OpenAI, sim: httpx.Client, stream: bool
) -> None:
    """The openai client's responses.retrieve of a response an OpenAI upstream keeps: fetched from
    the channel that holds it, the same response under the gateway's id; another account's, one
    made with store false and one deleted are 404 in OpenAI's words."""
    marker = "fetch " + os.urandom(4).hex()
    made: openai.types.responses.Response
    if stream:
        with oai.responses.stream(model=MODEL, input=marker) as s:
            made = s.get_final_response()
    else:
        made = oai.responses.create(model=MODEL, input=marker)
    fetched = oai.responses.retrieve(made.id)
    assert fetched.id == made.id and fetched.output_text == made.output_text
    assert fetched.usage == made.usage and fetched.status == "completed"
    # The response it continues is named by the gateway's id, as in the answer that made it.
    later = oai.responses.create(model=MODEL, input=f"{marker} again", previous_response_id=made.id)
    assert later.previous_response_id == made.id
    assert oai.responses.retrieve(later.id).previous_response_id == made.id
    gets = [e for e in sim.get("/_sim/requests").json() if e.get("method") == "GET"]
    assert (
        gets
        and gets[-1]["path"].startswith("/v1/responses/resp_")
        and gets[-1]["path"] != f"/v1/responses/{made.id}"
    )
    unstored = oai.responses.create(model=MODEL, input=marker, store=False)
    with openai.OpenAI(base_url=gw.openai_base, api_key=gw.new_key().key, max_retries=0) as stranger:
        for client, rid in ((stranger, made.id), (oai, unstored.id)):
            with pytest.raises(openai.NotFoundError) as gone:
                client.responses.retrieve(rid)
            assert isinstance(gone.value.body, dict)
            assert gone.value.body["message"] == f"Response with id '{rid}' not found."
    oai.responses.delete(made.id)
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(made.id)
    # The turn that continued it no longer has its gateway id to show, and never the upstream's.
    assert oai.responses.retrieve(later.id).previous_response_id is None


def test_a_continuation_the_upstream_no_longer_holds_is_refused_under_the_gateway_id(
    oai: openai.OpenAI, sim: httpx.Client
) -> None:
    """Responses review: the upstream's 400 quoted the id it holds the response under (OpenAI's
    "Previous response with id 'resp_…' not found."), an id the client never saw; it names the
    gateway's, as an unknown id's refusal does. Plain and streamed."""
    marker = "forgotten " + os.urandom(4).hex()
    first = oai.responses.create(model=MODEL, input=f"{marker} one")
    oai.responses.create(model=MODEL, input=f"{marker} two", previous_response_id=first.id)
    upstream_id = received(sim, marker)[-1]["previous_response_id"]
    assert isinstance(upstream_id, str)
    assert sim.delete(f"/v1/responses/{upstream_id}").status_code == 200  # the provider forgot it
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as err:
            oai.responses.create(
                model=MODEL, input=f"{marker} three", previous_response_id=first.id, stream=stream
            )
        assert first.id in err.value.message and upstream_id not in err.value.message
        assert isinstance(err.value.body, dict) and err.value.body["param"] == "previous_response_id"


def test_a_conversation_id_is_not_forwarded(gw: Gateway, key: KeyHandle, sim: httpx.Client) -> None:
    """Security review: `conversation` named an upstream conversation under the gateway's one
    upstream key, unchecked, so an account could read into another's (or the operator's). The
    gateway serves no conversations (every id one would come from is the upstream's own): the
    parameter is not among those it forwards, and is dropped (spec 1.3)."""
    marker = "conversation " + os.urandom(4).hex()
    with gw.client(key.key) as c:
        r = c.post(
            "/v1/responses", json={"model": MODEL, "input": marker, "conversation": "conv_someone_else"}
        )
        info = c.get("/model_group/info", params={"model_group": MODEL})
    assert r.status_code == 200, r.text
    (body,) = received(sim, marker)
    assert "conversation" not in body
    assert "conversation" not in info.json()["data"][0]["supported_openai_params"]


def test_an_upstream_item_is_named_only_by_its_own_account(gw: Gateway, oai: openai.OpenAI) -> None:
    """Security review: an item_reference to an upstream's item id went to the upstream unchecked,
    which keeps every account's items under the gateway's one key; another account could have it
    read. The output items of a response (plain, streamed) are recorded as its account's; another
    account naming one gets OpenAI's "not found"."""
    plain = oai.responses.create(model=MODEL, input="item owner plain")
    with oai.responses.stream(model=MODEL, input="item owner streamed") as stream:
        streamed = stream.get_final_response()
    other = gw.new_key()
    with openai.OpenAI(base_url=gw.openai_base, api_key=other.key, max_retries=0) as stranger:
        for made in (plain, streamed):
            item_id = made.output[-1].id
            assert item_id and item_id.startswith("msg_")
            reference = [{"type": "item_reference", "id": item_id}, {"role": "user", "content": "again"}]
            again = oai.responses.create(model=MODEL, input=reference)  # type: ignore[arg-type]
            assert again.status == "completed"
            with pytest.raises(openai.BadRequestError) as err:
                stranger.responses.create(model=MODEL, input=reference)  # type: ignore[arg-type]
            assert err.value.code == "invalid_request" and item_id in err.value.message
            assert isinstance(err.value.body, dict) and err.value.body["param"] == "input[0]"
        # A reasoning item sent back by its id alone, which OpenAI reads from what it stored.
        thought = oai.responses.create(model=MODEL, input="item owner [sim reasoning=3]")
        reasoning = next(item for item in thought.output if item.type == "reasoning")
        by_id = [{"type": "reasoning", "id": reasoning.id, "summary": []}, {"role": "user", "content": "go"}]
        assert oai.responses.create(model=MODEL, input=by_id).status == "completed"  # type: ignore[arg-type]
        with pytest.raises(openai.BadRequestError) as err:
            stranger.responses.create(model=MODEL, input=by_id)  # type: ignore[arg-type]
        assert reasoning.id in err.value.message

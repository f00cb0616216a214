"""A chat model on the Responses API keeps its conversation in the gateway (routes/kept_responses.py),
on both store backends, through the official openai client: a later turn continues it by
previous_response_id (plain, streamed, a tool loop) or names its output by item_reference; the kept
response comes back from GET /v1/responses/{id} and goes with DELETE; what was not kept, or is
another account's, is 400 or 404, and so is an item said twice; a conversation past the request
size limit is 413; an answer the store fails to keep still comes (charged once), said not to be
kept."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any, cast

import httpx
import openai
import pytest
from test_responses import check_unknown_foreign_and_unstored_refused
from test_responses_translation import TOOLS
from test_translation import GPT, marker, usage_record

from harness import Gateway, KeyHandle, chat_model, gateway, sim_requests

NATIVE = "openai/gpt-4.1-mini"  # a model of type responses: its upstream keeps the state


@pytest.fixture
def gw(backend_gw: Gateway) -> Gateway:
    return backend_gw


@pytest.fixture
def oai(gw: Gateway, key: KeyHandle) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gw.openai_base, api_key=key.key, max_retries=0) as c:
        yield c


def stored(response: Any) -> Any:
    """The Response's `store` (this client's types leave it out)."""
    return response.model_dump()["store"]


def said(messages: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """A chat request's messages as (role, content), tool calls and results by their call id."""
    out: list[tuple[str, Any]] = []
    for m in messages:
        if m.get("tool_calls"):
            out.append((m["role"], [c["function"]["name"] for c in m["tool_calls"]]))
        elif m["role"] == "tool":
            out.append(("tool", m["content"]))
        else:
            out.append((m["role"], m["content"]))
    return out


def test_previous_response_id_continues_the_conversation(
    gw: Gateway, oai: openai.OpenAI, sim: httpx.Client
) -> None:
    tag = marker()
    first = oai.responses.create(model=GPT, instructions="Be brief.", input=f"one {tag} [sim tokens=3]")
    assert stored(first) is True and first.previous_response_id is None
    second = oai.responses.create(model=GPT, input=f"two {tag} [sim tokens=4]", previous_response_id=first.id)
    assert second.previous_response_id == first.id and stored(second) is True
    # The whole conversation went upstream, and was billed: more input than the first turn's.
    assert second.usage is not None and first.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens
    # Streamed, then continued at once: it was kept before its last event reached the client.
    with oai.responses.stream(
        model=GPT, input=f"three {tag} [sim tokens=2]", previous_response_id=second.id
    ) as stream:
        third = stream.get_final_response()
    assert third.previous_response_id == second.id and stored(third) is True
    fourth = oai.responses.create(
        model=GPT, instructions="Answer.", input=f"four {tag}", previous_response_id=third.id
    )
    assert fourth.status == "completed"

    *_, last = sim_requests(sim, f"four {tag}")
    # Earlier turns' instructions are not carried over (as OpenAI does); this turn's lead.
    assert said(last["messages"]) == [
        ("system", "Answer."),
        ("user", f"one {tag} [sim tokens=3]"),
        ("assistant", first.output_text),
        ("user", f"two {tag} [sim tokens=4]"),
        ("assistant", second.output_text),
        ("user", f"three {tag} [sim tokens=2]"),
        ("assistant", third.output_text),
        ("user", f"four {tag}"),
    ]
    # The kept responses are there to fetch, as the client saw them.
    for made in (first, fourth):
        assert oai.responses.retrieve(made.id).model_dump() == made.model_dump()
    fetched = oai.responses.retrieve(third.id)  # the stream helper adds `parsed` to its copy
    assert (fetched.id, fetched.status, fetched.output_text) == (third.id, "completed", third.output_text)
    assert fetched.usage == third.usage and fetched.previous_response_id == second.id


@pytest.mark.parametrize("call_again", [False, True])
def test_a_tool_loop_by_previous_response_id(oai: openai.OpenAI, sim: httpx.Client, call_again: bool) -> None:
    tag = marker()
    asked = oai.responses.create(model=GPT, input=f"weather in Paris? {tag} [sim tool]", tools=TOOLS)
    (call,) = [item for item in asked.output if item.type == "function_call"]
    result: Any = [{"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}]
    if call_again:  # the AI SDK advancing previousResponseId at every step sends its call again
        again = {
            "type": "function_call",
            "call_id": call.call_id,
            "name": call.name,
            "arguments": call.arguments,
        }
        result.insert(0, again)
    answered = oai.responses.create(model=GPT, previous_response_id=asked.id, input=result, tools=TOOLS)
    assert answered.output_text and answered.previous_response_id == asked.id
    (received,) = [b for b in sim_requests(sim, tag) if any(m["role"] == "tool" for m in b["messages"])]
    assert said(received["messages"]) == [
        ("user", f"weather in Paris? {tag} [sim tool]"),
        ("assistant", ["get_weather"]),
        ("tool", "sunny, 21 C"),
    ]
    assert received["messages"][1]["tool_calls"][0]["id"] == call.call_id


def test_item_references_name_kept_output(gw: Gateway, oai: openai.OpenAI, sim: httpx.Client) -> None:
    tag = marker()
    first = oai.responses.create(model=GPT, input=f"one {tag} [sim tokens=3]")
    (message,) = first.output
    # The AI SDK's openai.responses(...) sends its earlier turns so (its `store` is true by default).
    history: list[Any] = [
        {"role": "user", "content": [{"type": "input_text", "text": f"one {tag} [sim tokens=3]"}]},
        {"type": "item_reference", "id": message.id},
    ]
    second = oai.responses.create(model=GPT, input=[*history, {"role": "user", "content": f"two {tag}"}])
    assert second.status == "completed"
    (received,) = sim_requests(sim, f"two {tag}")
    assert said(received["messages"]) == [
        ("user", f"one {tag} [sim tokens=3]"),
        ("assistant", first.output_text),
        ("user", f"two {tag}"),
    ]
    # An item this account has not kept: unknown, or another account's.
    stranger = gw.new_key()
    with openai.OpenAI(base_url=gw.openai_base, api_key=stranger.key, max_retries=0) as theirs:
        for client, item_id in ((oai, "msg_0123456789abcdef"), (oai, "fc_nope_0"), (theirs, message.id)):
            with pytest.raises(openai.BadRequestError) as err:
                reference: Any = [{"type": "item_reference", "id": item_id}]
                client.responses.create(model=GPT, input=reference)
            assert isinstance(err.value.body, dict) and err.value.body["param"] == "input[0]"
            assert str(item_id) in err.value.message
    # Thousands of references, each to a response of its own: looked up, not a failure of the store.
    many: Any = [{"type": "item_reference", "id": f"msg_{i:032x}"} for i in range(3000)]
    with pytest.raises(openai.BadRequestError) as err:
        oai.responses.create(model=GPT, input=many)
    assert isinstance(err.value.body, dict) and err.value.body["param"] == "input[0]"


def test_an_item_said_twice_is_refused(oai: openai.OpenAI) -> None:
    first = oai.responses.create(model=GPT, input="one [sim tokens=2]")
    second = oai.responses.create(model=GPT, input="two [sim tokens=2]", previous_response_id=first.id)
    reference = {"type": "item_reference", "id": first.output[0].id}
    body: dict[str, Any]
    for body in (
        {"input": [reference], "previous_response_id": second.id},  # already in the conversation
        {"input": [reference, reference]},
    ):
        with pytest.raises(openai.BadRequestError) as err:
            oai.responses.create(model=GPT, **body)
        assert "Duplicate item" in err.value.message


def test_a_responses_model_cannot_continue_what_the_gateway_keeps(oai: openai.OpenAI) -> None:
    kept = oai.responses.create(model=GPT, input="said by a chat model")
    reference = {"type": "item_reference", "id": kept.output[0].id}
    body: dict[str, Any]
    for body, param in (
        ({"previous_response_id": kept.id, "input": "next"}, "previous_response_id"),
        ({"input": [{"role": "user", "content": "hi"}, reference]}, "input[1]"),
    ):
        with pytest.raises(openai.BadRequestError) as err:
            oai.responses.create(model=NATIVE, **body)
        assert isinstance(err.value.body, dict) and err.value.body["param"] == param
        assert GPT in err.value.message and NATIVE in err.value.message
    with pytest.raises(openai.BadRequestError) as err:
        oai.responses.create(model=GPT, input="x", store=cast(Any, "no"))
    assert isinstance(err.value.body, dict) and err.value.body["param"] == "store"


def test_what_is_not_kept_cannot_be_continued_or_fetched(gw: Gateway, oai: openai.OpenAI) -> None:
    unkept, kept = check_unknown_foreign_and_unstored_refused(gw, oai, GPT)
    assert stored(unkept) is False
    native = oai.responses.create(model=NATIVE, input="held upstream")
    stranger = gw.new_key()
    with openai.OpenAI(base_url=gw.openai_base, api_key=stranger.key, max_retries=0) as theirs:
        for client, rid in ((oai, unkept.id), (theirs, kept.id)):
            with pytest.raises(openai.NotFoundError):
                client.responses.retrieve(rid)
    # A response its upstream keeps cannot be continued by a chat model: the error names its model.
    with pytest.raises(openai.BadRequestError) as err:
        oai.responses.create(model=GPT, input="next", previous_response_id=native.id)
    assert NATIVE in err.value.message


def test_a_conversation_past_the_size_limit_is_413(tmp_path: Path, sim_url: str) -> None:
    models = chat_model(GPT, "gpt-4o-mini", sim_url)
    with gateway(tmp_path, models, limits_toml="max_request_bytes = 4096") as small:
        handle = small.new_key()
        with openai.OpenAI(base_url=small.openai_base, api_key=handle.key, max_retries=0) as oai:
            previous = None
            with pytest.raises(openai.APIStatusError) as err:
                for _ in range(10):  # each turn under the limit; the whole conversation soon past it
                    previous = oai.responses.create(
                        model=GPT, input="x" * 1500 + " [sim tokens=3]", previous_response_id=previous
                    ).id
            assert previous is not None  # the first turns were answered
            assert err.value.status_code == 413
            assert isinstance(err.value.body, dict) and err.value.body["code"] == "request_too_large"
            assert err.value.body["param"] == "previous_response_id"
            # What references bring in counts as sent: a few long answers, named in a small request.
            long = [oai.responses.create(model=GPT, input="x [sim tokens=200]") for _ in range(5)]
            references = [{"type": "item_reference", "id": r.output[0].id} for r in long]
            with pytest.raises(openai.APIStatusError) as err:
                oai.responses.create(model=GPT, input=references)  # type: ignore[arg-type]
            assert err.value.status_code == 413
            assert isinstance(err.value.body, dict) and err.value.body["param"] == "input"


def test_an_answer_the_store_fails_to_keep_still_comes_unkept(tmp_path: Path, sim_url: str) -> None:
    with gateway(tmp_path, chat_model(GPT, "gpt-4o-mini", sim_url)) as lone:
        handle = lone.new_key()
        with sqlite3.connect(lone.db_path) as conn:  # the store fails to keep anything from now on
            conn.execute("DROP TABLE kept_responses")
        with openai.OpenAI(base_url=lone.openai_base, api_key=handle.key, max_retries=0) as oai:
            raw = oai.responses.with_raw_response.create(model=GPT, input="hi [sim tokens=3]")
            plain = raw.parse()
            # Answered and charged once, said not to be kept (as with store: false).
            assert stored(plain) is False and len(plain.output_text.split()) == 3
            assert Decimal(raw.headers["x-service-cost"]) > 0
            with oai.responses.stream(model=GPT, input="hi [sim tokens=4]") as stream:
                streamed = stream.get_final_response()
            assert stored(streamed) is False and streamed.status == "completed"
            assert usage_record(lone, handle, streamed.id)["usage"]["completion_tokens"] == 4


def test_a_response_is_deleted_where_it_is_kept(gw: Gateway, oai: openai.OpenAI, sim: httpx.Client) -> None:
    """The openai client's responses.delete: a kept response is gone (not fetched, not continued,
    its items not named), a later turn that continued it can no longer be continued, and the turn
    before it still can; a response its upstream keeps is deleted there too, then forgotten."""
    tag = marker()
    first = oai.responses.create(model=GPT, input=f"one {tag}")
    second = oai.responses.create(model=GPT, input=f"two {tag}", previous_response_id=first.id)
    third = oai.responses.create(model=GPT, input=f"three {tag}", previous_response_id=second.id)
    stranger = gw.new_key()
    with (
        openai.OpenAI(base_url=gw.openai_base, api_key=stranger.key, max_retries=0) as theirs,
        pytest.raises(openai.NotFoundError),
    ):
        theirs.responses.delete(second.id)
    deleted = httpx.delete(f"{gw.openai_base}/responses/{second.id}", headers=oai.auth_headers)
    assert deleted.status_code == 200 and deleted.json() == {
        "id": second.id,
        "object": "response",
        "deleted": True,
    }
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(second.id)
    with pytest.raises(openai.NotFoundError) as gone:
        oai.responses.delete(second.id)
    assert gone.value.body == {
        "message": f"Response with id '{second.id}' not found.",
        "type": "not_found_error",
        "param": None,
        "code": "not_found",
    }
    refused: list[tuple[dict[str, Any], str]] = [
        ({"previous_response_id": second.id}, "previous_response_id"),
        ({"previous_response_id": third.id}, "previous_response_id"),
        ({"input": [{"type": "item_reference", "id": second.output[0].id}]}, "input[0]"),
    ]
    for body, param in refused:
        with pytest.raises(openai.BadRequestError) as err:
            oai.responses.create(model=GPT, **cast(Any, {"input": "next", **body}))
        assert isinstance(err.value.body, dict) and err.value.body["param"] == param
    with pytest.raises(openai.BadRequestError) as err:
        oai.responses.create(model=GPT, input="next", previous_response_id=third.id)
    assert f"'{second.id}', which was deleted" in err.value.message
    assert oai.responses.create(model=GPT, input="next", previous_response_id=first.id).status == "completed"
    # Held upstream: deleted there (the simulator refuses a continuation of it from then on).
    native = oai.responses.create(model=NATIVE, input=f"native {tag}")
    oai.responses.delete(native.id)
    deletes = [e for e in sim.get("/_sim/requests").json() if e.get("method") == "DELETE"]
    assert deletes and deletes[-1]["path"].startswith("/v1/responses/resp_")
    with pytest.raises(openai.BadRequestError):
        oai.responses.create(model=NATIVE, input="next", previous_response_id=native.id)

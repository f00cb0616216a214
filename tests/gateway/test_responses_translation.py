"""/v1/responses on a chat model: the request said as chat completions, the answer and the stream
built back into a Response, through the official openai client (plain, streamed with its stream
helper, tools, reasoning, structured output); billing from the upstream's usage; what cannot be said
to a chat model refused clearly. The conversations the gateway keeps: test_kept_responses.py."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import httpx
import openai
import pytest
from test_translation import GPT, PRICES, WEATHER_TOOL_SCHEMA, marker, raw_stream, usage_record

from gateway.pricing import Usage, cost
from harness import Gateway, KeyHandle, eventually, sim_requests

TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "The forecast for a city",
        "parameters": WEATHER_TOOL_SCHEMA,
    }
]


@pytest.fixture
def oai(gw: Gateway, key: KeyHandle) -> Any:
    with openai.OpenAI(base_url=gw.openai_base, api_key=key.key, max_retries=0) as c:
        yield c


def test_plain_response_from_a_chat_model_is_billed_from_its_usage(
    gw: Gateway, key: KeyHandle, oai: openai.OpenAI, sim: httpx.Client
) -> None:
    tag = marker()
    before = gw.balance(key.account_id)
    raw = oai.responses.with_raw_response.create(
        model=GPT,
        instructions="Be brief.",
        input=f"Hello {tag} [sim tokens=6]",
        max_output_tokens=50,
        temperature=0.5,
        metadata={"ticket": "42"},
    )
    response = raw.parse()
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.status == "completed" and response.incomplete_details is None
    assert response.model == "gpt-4o-mini" and response.instructions == "Be brief."
    assert response.temperature == 0.5 and response.metadata == {"ticket": "42"}
    (message,) = response.output
    assert message.type == "message" and message.role == "assistant" and message.status == "completed"
    assert len(response.output_text.split()) == 6
    assert response.usage is not None and response.usage.output_tokens == 6
    assert response.usage.input_tokens > 0
    assert response.usage.total_tokens == response.usage.input_tokens + 6
    charged = Decimal(raw.headers["x-service-cost"])
    assert charged == cost(PRICES, Usage(response.usage.input_tokens, 6)) > 0
    assert raw.headers["x-service-request-id"].startswith("req_")
    assert gw.wait_balance(key.account_id, before - charged) == before - charged
    record = usage_record(gw, key, response.id)
    assert record["model"] == GPT and record["status"] == "completed"
    assert Decimal(str(record["cost"])) == charged

    (received,) = sim_requests(sim, tag)
    assert received["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": f"Hello {tag} [sim tokens=6]"},
    ]
    assert received["temperature"] == 0.5
    assert received.get("max_completion_tokens", received.get("max_tokens")) == 50
    assert "input" not in received and "instructions" not in received and "metadata" not in received


def test_streamed_response_through_the_client_stream_helper(
    gw: Gateway, key: KeyHandle, oai: openai.OpenAI
) -> None:
    with oai.responses.stream(model=GPT, input="Stream [sim tokens=9]") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert len(deltas) == 9 and final.output_text == "".join(deltas)
    assert final.id.startswith("resp_") and final.status == "completed"
    assert final.usage is not None and final.usage.output_tokens == 9 and final.usage.input_tokens > 0
    record = usage_record(gw, key, final.id)
    assert record["status"] == "completed"
    assert record["usage"]["completion_tokens"] == 9
    assert record["usage"]["prompt_tokens"] == final.usage.input_tokens
    assert Decimal(str(record["cost"])) == cost(PRICES, Usage(final.usage.input_tokens, 9))


def test_raw_translated_responses_stream_is_the_api_s_event_sequence(gw: Gateway, key: KeyHandle) -> None:
    events = raw_stream(gw, key, "/v1/responses", {"model": GPT, "input": "x [sim tokens=3 reasoning=2]"})
    names = [name for name, _ in events]
    assert names == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",  # the reasoning
        "response.reasoning_summary_part.added",
        *["response.reasoning_summary_text.delta"] * 2,
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.output_item.done",
        "response.output_item.added",  # the message
        "response.content_part.added",
        *["response.output_text.delta"] * 3,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
        None,
    ]
    assert events[-1] == (None, "[DONE]")
    payloads = [json.loads(data) for _, data in events[:-1]]
    assert [p["type"] for p in payloads] == names[:-1]
    assert [p["sequence_number"] for p in payloads] == list(range(len(payloads)))
    rid = payloads[0]["id"]
    assert rid.startswith("resp_") and all(p["id"] == rid for p in payloads)
    assert payloads[0]["response"]["id"] == rid and payloads[0]["response"]["status"] == "in_progress"
    completed = payloads[-1]["response"]
    assert completed["id"] == rid and completed["status"] == "completed"
    reasoning, message = completed["output"]
    assert reasoning["type"] == "reasoning" and len(reasoning["summary"][0]["text"].split()) == 2
    assert message["content"][0]["text"] == "".join(p["delta"] for p in payloads[11:14])
    usage = completed["usage"]
    assert usage["output_tokens_details"]["reasoning_tokens"] > 0
    assert usage["output_tokens"] > usage["output_tokens_details"]["reasoning_tokens"]


def test_a_length_stop_is_an_incomplete_response(oai: openai.OpenAI) -> None:
    response = oai.responses.create(model=GPT, input="Long [sim tokens=20]", max_output_tokens=4)
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert len(response.output_text.split()) == 4
    with oai.responses.stream(model=GPT, input="Long [sim tokens=20]", max_output_tokens=4) as stream:
        kinds = [e.type for e in stream]
    assert kinds[-1] == "response.incomplete"


def test_function_tools_round_trip(oai: openai.OpenAI, sim: httpx.Client) -> None:
    tag = marker()
    response = oai.responses.create(
        model=GPT,
        input=f"weather? {tag}",
        tools=[*TOOLS, {"type": "web_search"}],
        tool_choice={"type": "function", "name": "get_weather"},
        parallel_tool_calls=False,
    )
    (call,) = response.output
    assert call.type == "function_call" and call.name == "get_weather" and call.status == "completed"
    arguments = json.loads(call.arguments)
    assert arguments["days"] == 1 and isinstance(arguments["city"], str)
    (received,) = sim_requests(sim, tag)
    # The hosted tool has no counterpart in the chat shape: left out.
    assert received["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The forecast for a city",
                "parameters": WEATHER_TOOL_SCHEMA,
            },
        }
    ]
    assert received["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert received["parallel_tool_calls"] is False

    # The next turn: the call and its output, as the Agents SDK sends them back.
    follow = marker()
    second = oai.responses.create(
        model=GPT,
        input=[
            {"role": "user", "content": f"weather? {follow}"},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21C"},
        ],
        tools=TOOLS,
    )
    assert second.status == "completed" and second.output_text
    (received,) = sim_requests(sim, follow)
    assert received["messages"] == [
        {"role": "user", "content": f"weather? {follow}"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": call.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.call_id, "content": "Sunny, 21C"},
    ]


def test_streamed_function_call_arguments(oai: openai.OpenAI) -> None:
    with oai.responses.stream(model=GPT, input="weather in Paris? [sim tool]", tools=TOOLS) as stream:
        deltas = [e.delta for e in stream if e.type == "response.function_call_arguments.delta"]
        final = stream.get_final_response()
    assert len(deltas) > 2  # the arguments came in fragments
    (call,) = final.output
    assert call.type == "function_call" and call.arguments == "".join(deltas)
    assert json.loads(call.arguments)["days"] == 1
    assert final.usage is not None and final.usage.output_tokens > 0


def test_message_parts_and_structured_output_reach_the_chat_model(
    oai: openai.OpenAI, sim: httpx.Client
) -> None:
    tag = marker()
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    }
    conversation: list[Any] = [
        {"role": "developer", "content": "Answer in JSON."},
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": f"Where? {tag}"},
                {"type": "input_image", "image_url": "https://example.com/a.png", "detail": "low"},
            ],
        },
        {"role": "assistant", "content": [{"type": "output_text", "text": "Paris."}]},
        {"role": "user", "content": "And now?"},
    ]
    response = oai.responses.create(
        model=GPT,
        input=conversation,
        text={"format": {"type": "json_schema", "name": "place", "schema": schema, "strict": True}},
    )
    assert json.loads(response.output_text)["city"]
    (received,) = sim_requests(sim, tag)
    assert received["messages"] == [
        {"role": "system", "content": "Answer in JSON."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": f"Where? {tag}"},
                {"type": "image_url", "image_url": {"url": "https://example.com/a.png", "detail": "low"}},
            ],
        },
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And now?"},
    ]
    assert received["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "place", "schema": schema, "strict": True},
    }


def test_mid_stream_error_ends_with_the_error_event_and_bills_what_came(gw: Gateway, key: KeyHandle) -> None:
    events = raw_stream(gw, key, "/v1/responses", {"model": GPT, "input": "x [sim tokens=8 error_after=2]"})
    name, data = events[-1]
    assert name == "error" and json.loads(data)["code"] == "provider_error"
    names = [n for n, _ in events]
    assert "response.completed" not in names and (None, "[DONE]") not in events
    payloads = [json.loads(d) for _, d in events[:-1]]
    deltas = [p["delta"] for p in payloads if p["type"] == "response.output_text.delta"]
    assert len(deltas) == 2
    record = usage_record(gw, key, payloads[0]["id"])
    assert record["status"] == "incomplete" and record["usage"]["completion_tokens"] == 2


def test_background_is_dropped_and_the_response_answered_at_once(
    gw: Gateway, key: KeyHandle, oai: openai.OpenAI, sim: httpx.Client
) -> None:
    """Review: `background: true` to a chat model was 400. Nothing of a chat upstream runs in the
    background, so the parameter is dropped (spec 1.3, as a responses model that does not take it
    drops it): the answer is final at once, and retrieving it gives it again."""
    tag = marker()
    response = oai.responses.create(model=GPT, input=f"now {tag} [sim tokens=3]", background=True)
    assert response.status == "completed" and len(response.output_text.split()) == 3
    assert oai.responses.retrieve(response.id).status == "completed"
    (sent,) = sim_requests(sim, tag)
    assert "background" not in sent

    def logged() -> bool:
        rows = gw.query("SELECT attempts FROM request_logs WHERE usage_id = ?", response.id)
        return bool(rows) and json.loads(rows[0][0])[-1].get("dropped_params") == ["background"]

    eventually(logged, 5, what="the request's log entry naming background dropped")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "hi", "previous_response_id": "resp_123"}, "previous_response_id"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]"),
        ({"input": [{"role": "user", "content": "hi"}, {"type": "item_reference", "id": 7}]}, "input[1].id"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_url": "https://x/a.pdf"}]}]},
            "input[0].content[0]",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
            "input[0].content[0]",
        ),
        ({"input": [{"role": "robot", "content": "hi"}]}, "input[0].role"),
        ({"input": [{"type": []}]}, "input[0].type"),
        ({"input": [{"role": "user", "content": "hi", "type": {"a": 1}}]}, "input[0].type"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
        ({"input": "hi", "text": {"format": {"type": "xml"}}}, "text.format"),
        ({"input": "hi", "tool_choice": 7}, "tool_choice"),
        ({"input": []}, "input"),
    ],
)
def test_what_a_chat_model_cannot_be_asked_is_400(gw: Gateway, body: dict[str, Any], param: str) -> None:
    # Too little money for any hold: the 400 comes first, as nothing is held before the translation.
    key = gw.new_key(balance="0.000001")
    before = gw.balance(key.account_id)
    with gw.client(key.key) as c:
        r = c.post("/v1/responses", json={"model": GPT, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_request" and error["param"] == param
    assert gw.balance(key.account_id) == before
    # Logged with the model it named, though refused while its body was checked.
    rid = r.headers["x-service-request-id"]
    logged = eventually(
        lambda: gw.query("SELECT model FROM request_logs WHERE id = ?", rid), what="its entry"
    )
    assert [tuple(row) for row in logged] == [(GPT,)]


def check_responses_shape(gw: Gateway, model: str) -> None:
    """The openai client's responses API on a chat model of another provider (Gemini, Bedrock,
    Vertex): plain, streamed with a content filter stopping it (an incomplete response billed for what
    came), and a function call streamed."""
    handle = gw.new_key()
    before = gw.balance(handle.account_id)
    with openai.OpenAI(api_key=handle.key, base_url=gw.url + "/v1", max_retries=0) as oai:
        raw = oai.responses.with_raw_response.create(model=model, input="hi [sim tokens=5]")
        response = raw.parse()
        assert response.status == "completed" and len(response.output_text.split()) == 5
        assert response.usage is not None and response.usage.output_tokens == 5
        charged = Decimal(raw.headers["x-service-cost"])
        assert charged > 0
        events = list(
            oai.responses.create(model=model, input="go [sim tokens=6 filter_after=2]", stream=True)
        )
        assert len([e for e in events if e.type == "response.output_text.delta"]) == 2
        assert events[-1].type == "response.incomplete"
        stopped = events[-1].response
        assert stopped.incomplete_details is not None
        assert stopped.incomplete_details.reason == "content_filter"
        assert stopped.usage is not None and stopped.usage.output_tokens == 2
        with oai.responses.stream(model=model, input="weather in Paris? [sim tool]", tools=TOOLS) as calls:
            done = calls.get_final_response()
        (call,) = done.output
        assert call.type == "function_call" and call.name == "get_weather"
        assert json.loads(call.arguments)["days"] == 1
    record = usage_record(gw, handle, response.id)
    assert record["model"] == model and Decimal(str(record["cost"])) == charged
    assert gw.balance(handle.account_id) < before - charged


CLAUDE = "anthropic/claude-sonnet-4-5"


def test_a_messages_model_on_the_responses_api(gw: Gateway, key: KeyHandle, sim: httpx.Client) -> None:
    """A messages model (Claude through Anthropic) on /v1/responses, as the Agents SDK's and the
    AI SDK's default models call it: the request said as a message request, the answer and the
    stream as Responses, billed from Anthropic's usage; kept like a chat model's, so the next turn
    continues it with previous_response_id."""
    handle = gw.new_key()
    with openai.OpenAI(api_key=handle.key, base_url=gw.url + "/v1", max_retries=0) as oai:
        tag = marker()
        raw = oai.responses.with_raw_response.create(
            model=CLAUDE, instructions="Be brief.", input=f"{tag} hi [sim tokens=5]", max_output_tokens=50
        )
        first = raw.parse()
        assert first.status == "completed" and len(first.output_text.split()) == 5
        assert first.usage is not None and first.usage.output_tokens == 5
        (sent,) = [r for r in sim_requests(sim, tag)]
        assert sent["max_tokens"] == 50 and sent["system"] and sent["messages"][0]["role"] == "user"
        assert Decimal(raw.headers["x-service-cost"]) > 0
        with oai.responses.stream(
            model=CLAUDE, input="and then? [sim tokens=4]", previous_response_id=first.id
        ) as stream:
            second = stream.get_final_response()
        assert second.status == "completed" and len(second.output_text.split()) == 4
        assert second.previous_response_id == first.id
        assert oai.responses.retrieve(second.id).output_text == second.output_text
        with oai.responses.stream(model=CLAUDE, input="weather in Paris? [sim tool]", tools=TOOLS) as calls:
            done = calls.get_final_response()
        (call,) = done.output
        assert call.type == "function_call" and call.name == "get_weather"
    record = usage_record(gw, handle, first.id)
    assert record["model"] == CLAUDE and Decimal(str(record["cost"])) == Decimal(
        raw.headers["x-service-cost"]
    )

"""Structured output on every text shape, with the official clients: the parameter reaches the model
(its own shape's name for it, or translated), the simulator answers JSON valid for the schema, and
the client gets that JSON back as its content, plain and streamed."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from pydantic import BaseModel

from harness import Gateway, KeyHandle

CLAUDE = "anthropic/claude-sonnet-4-5"
GPT = "openai/gpt-4o-mini"
RESPONSES = "openai/gpt-4.1-mini"
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer", "minimum": 3, "maximum": 14},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2},
        "detail": {
            "type": "object",
            "properties": {"sunny": {"type": "boolean"}, "score": {"type": "number"}},
            "required": ["sunny", "score"],
            "additionalProperties": False,
        },
        "note": {"anyOf": [{"type": "string", "format": "date"}, {"type": "null"}]},
    },
    "required": ["city", "days", "unit", "tags", "detail", "note"],
    "additionalProperties": False,
}


class Detail(BaseModel):
    sunny: bool
    score: float


class Forecast(BaseModel):
    city: str
    days: int
    unit: str
    tags: list[str]
    detail: Detail
    note: str | None


def assert_valid(text: str | None) -> None:
    """`text` is JSON of SCHEMA: every required property, of its type, within its bounds."""
    assert text is not None
    value = json.loads(text)
    forecast = Forecast.model_validate(value)
    assert set(value) == set(SCHEMA["required"])
    assert 3 <= forecast.days <= 14 and forecast.unit == "celsius" and len(forecast.tags) == 2
    assert isinstance(value["days"], int) and forecast.note == "2026-01-01"


@pytest.fixture
def oai(gw: Gateway, key: KeyHandle) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gw.openai_base, api_key=key.key, max_retries=0) as c:
        yield c


@pytest.fixture
def claude(gw: Gateway, key: KeyHandle) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=gw.url, api_key=key.key, max_retries=0) as c:
        yield c


def marker() -> str:
    return "json-" + os.urandom(6).hex()


def received(sim: httpx.Client, text: str) -> dict[str, Any]:
    """The one body the simulator received whose request mentions `text`."""
    bodies = [e["body"] for e in sim.get("/_sim/requests").json() if text in json.dumps(e.get("body"))]
    assert len(bodies) == 1, bodies
    body: dict[str, Any] = bodies[0]
    return body


RESPONSE_FORMAT: Any = {
    "type": "json_schema",
    "json_schema": {"name": "forecast", "schema": SCHEMA, "strict": True},
}


@pytest.mark.parametrize("model", [GPT, CLAUDE])
def test_chat_response_format_json_schema(oai: openai.OpenAI, sim: httpx.Client, model: str) -> None:
    """Native on a chat model; translated to output_config.format for a messages-family model."""
    m = marker()
    completion = oai.chat.completions.create(
        model=model, messages=[{"role": "user", "content": m}], response_format=RESPONSE_FORMAT
    )
    assert_valid(completion.choices[0].message.content)
    assert completion.choices[0].finish_reason == "stop"
    body = received(sim, m)
    if model == CLAUDE:
        assert body["output_config"] == {"format": {"type": "json_schema", "schema": SCHEMA}}
        assert "response_format" not in body
    else:
        assert body["response_format"] == RESPONSE_FORMAT

    m = marker()
    stream = oai.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": m}],
        response_format=RESPONSE_FORMAT,
        stream=True,
    )
    assert_valid("".join(c.choices[0].delta.content or "" for c in stream if c.choices))


def test_chat_parse_with_a_pydantic_model_on_a_messages_model(oai: openai.OpenAI) -> None:
    """The openai client's own structured-output helper, as instructor and the Agents SDK use it."""
    completion = oai.chat.completions.parse(
        model=CLAUDE, messages=[{"role": "user", "content": "forecast"}], response_format=Detail
    )
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, Detail) and parsed.sunny is True


def test_chat_json_object_on_a_messages_model_is_asked_in_the_system_prompt(
    oai: openai.OpenAI, sim: httpx.Client
) -> None:
    m = marker()
    oai.chat.completions.create(
        model=CLAUDE,
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": m}],
        response_format={"type": "json_object"},
    )
    body = received(sim, m)
    assert "output_config" not in body
    assert body["system"][0] == {"type": "text", "text": "be brief"}
    assert "JSON object" in body["system"][1]["text"]


@pytest.mark.parametrize("model", [CLAUDE, GPT])
def test_messages_output_config_format(claude: anthropic.Anthropic, sim: httpx.Client, model: str) -> None:
    """Native on a messages-family model; translated to response_format for a chat model."""
    m = marker()
    message = claude.messages.create(
        model=model,
        max_tokens=200,
        messages=[{"role": "user", "content": m}],
        output_config={"format": {"type": "json_schema", "schema": SCHEMA}},
    )
    assert message.content[0].type == "text"
    assert_valid(message.content[0].text)
    body = received(sim, m)
    if model == GPT:
        assert body["response_format"] == {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": SCHEMA, "strict": True},
        }
    else:
        assert body["output_config"] == {"format": {"type": "json_schema", "schema": SCHEMA}}

    with claude.messages.stream(
        model=model,
        max_tokens=200,
        messages=[{"role": "user", "content": marker()}],
        output_config={"format": {"type": "json_schema", "schema": SCHEMA}},
    ) as stream:
        assert_valid("".join(stream.text_stream))


@pytest.mark.parametrize("model", [CLAUDE, GPT])
def test_messages_beta_output_format_with_its_header(
    gw: Gateway, key: KeyHandle, sim: httpx.Client, model: str
) -> None:
    """LiteLLM's way: the beta's `output_format` and an anthropic-beta header."""
    m = marker()
    headers = {"x-api-key": key.key, "anthropic-beta": "structured-outputs-2025-11-13"}
    body = {
        "model": model,
        "max_tokens": 200,
        "messages": [{"role": "user", "content": m}],
        "output_format": {"type": "json_schema", "schema": SCHEMA},
    }
    r = httpx.post(gw.url + "/v1/messages", json=body, headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    assert_valid(r.json()["content"][0]["text"])
    upstream = received(sim, m)
    if model == CLAUDE:
        assert upstream["output_format"] == body["output_format"]
    else:
        assert upstream["response_format"]["json_schema"]["schema"] == SCHEMA


def test_responses_text_format(oai: openai.OpenAI, sim: httpx.Client) -> None:
    m = marker()
    text_format: Any = {
        "format": {"type": "json_schema", "name": "forecast", "schema": SCHEMA, "strict": True}
    }
    response = oai.responses.create(model=RESPONSES, input=m, text=text_format)
    assert_valid(response.output_text)
    assert received(sim, m)["text"] == text_format
    with oai.responses.stream(model=RESPONSES, input=marker(), text=text_format) as stream:
        final = stream.get_final_response()
    assert_valid(final.output_text)
    parsed = oai.responses.parse(model=RESPONSES, input="forecast", text_format=Detail).output_parsed
    assert isinstance(parsed, Detail)


def test_model_group_info_lists_the_structured_output_parameters(gw: Gateway, key: KeyHandle) -> None:
    with gw.client(key.key) as c:
        params = {
            model: set(
                c.get("/model_group/info", params={"model_group": model}).json()["data"][0][
                    "supported_openai_params"
                ]
            )
            for model in (CLAUDE, GPT, RESPONSES)
        }
    assert {"output_config", "output_format", "cache_control"} <= params[CLAUDE]
    assert {"response_format", "prompt_cache_retention", "moderation"} <= params[GPT]
    assert {"text", "context_management", "prompt_cache_retention"} <= params[RESPONSES]
    # What changes the provider's price per token is not forwarded by default (review: a client
    # picked the priority tier or fast mode and paid the standard price).
    assert not {"service_tier", "speed", "inference_geo"} & (params[CLAUDE] | params[GPT] | params[RESPONSES])

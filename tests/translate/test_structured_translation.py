"""Structured output across the two text shapes (pure functions), and the simulator's values for a
JSON schema."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.errors import GatewayError
from gateway.sim.structured import answer_text, requested_schema, value_for
from gateway.translate import chat_request_from_messages, messages_request_from_chat
from gateway.translate.messages_request import JSON_OBJECT_INSTRUCTION

SCHEMA: dict[str, Any] = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}


def message(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}], **fields}


def test_json_schema_becomes_output_config_format() -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}}
    request = messages_request_from_chat(chat(response_format=fmt), 100)
    assert request["output_config"] == {"format": {"type": "json_schema", "schema": SCHEMA}}
    assert "system" not in request


def test_json_object_is_asked_for_in_the_system_prompt() -> None:
    request = messages_request_from_chat(chat(response_format={"type": "json_object"}), 100)
    assert request["system"] == JSON_OBJECT_INSTRUCTION and "output_config" not in request
    with_system = chat(response_format={"type": "json_object"})
    with_system["messages"].insert(0, {"role": "system", "content": "be brief"})
    request = messages_request_from_chat(with_system, 100)
    assert request["system"] == [
        {"type": "text", "text": "be brief"},
        {"type": "text", "text": JSON_OBJECT_INSTRUCTION},
    ]


def test_text_format_changes_nothing() -> None:
    assert messages_request_from_chat(
        chat(response_format={"type": "text"}), 100
    ) == messages_request_from_chat(chat(), 100)


@pytest.mark.parametrize(
    "fmt",
    [{"type": "json_schema"}, {"type": "json_schema", "json_schema": {"schema": 5}}, {"type": "xml"}, "json"],
)
def test_a_malformed_response_format_is_400(fmt: Any) -> None:
    with pytest.raises(GatewayError) as caught:
        messages_request_from_chat(chat(response_format=fmt), 100)
    assert caught.value.code == "invalid_request" and caught.value.param == "response_format"


@pytest.mark.parametrize(
    "fields",
    [
        {"output_config": {"format": {"type": "json_schema", "schema": SCHEMA}, "effort": "low"}},
        {"output_format": {"type": "json_schema", "schema": SCHEMA}},
    ],
)
def test_output_format_becomes_response_format(fields: dict[str, Any]) -> None:
    request = chat_request_from_messages(message(**fields), "max_completion_tokens")
    assert request["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": SCHEMA, "strict": True},
    }


def test_output_config_without_a_format_adds_nothing() -> None:
    request = chat_request_from_messages(message(output_config={"effort": "low"}), "max_tokens")
    assert "response_format" not in request


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"output_config": 5}, "output_config"),
        ({"output_config": {"format": {"type": "text"}}}, "output_config.format"),
        ({"output_format": {"type": "json_schema"}}, "output_format"),
    ],
)
def test_a_malformed_output_format_is_400(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(GatewayError) as caught:
        chat_request_from_messages(message(**fields), "max_tokens")
    assert caught.value.code == "invalid_request" and caught.value.param == param


# ------------------------------------------------------------------ the simulator's values


def test_where_each_api_asks_for_json() -> None:
    fmt = {"type": "json_schema", "schema": SCHEMA}
    assert (
        requested_schema(
            {"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}}, "chat"
        )
        == SCHEMA
    )
    assert requested_schema({"response_format": {"type": "json_object"}}, "chat") == {}
    assert requested_schema({"response_format": {"type": "text"}}, "chat") is None
    assert requested_schema({"text": {"format": {**fmt, "name": "x"}}}, "responses") == SCHEMA
    assert requested_schema({"output_config": {"format": fmt}}, "messages") == SCHEMA
    assert requested_schema({"output_format": fmt}, "messages") == SCHEMA
    assert requested_schema({"output_config": {"effort": "low"}}, "messages") is None


def test_values_follow_the_schema() -> None:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": 5, "maximum": 9},
            "x": {"type": "number", "exclusiveMaximum": 0},
            "s": {"type": "string", "minLength": 12, "maxLength": 20},
            "e": {"enum": ["b", "a"]},
            "c": {"const": 3},
            "f": {"type": ["null", "boolean"]},
            "when": {"type": "string", "format": "date-time"},
            "list": {"type": "array", "items": {"$ref": "#/$defs/item"}, "minItems": 3},
            "pair": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}]},
            "either": {"anyOf": [{"type": "null"}, {"type": "number"}]},
            "both": {
                "allOf": [{"properties": {"p": {"type": "boolean"}}}, {"properties": {"q": {"type": "null"}}}]
            },
        },
        "$defs": {"item": {"type": "object", "properties": {"id": {"type": "integer"}}}},
    }
    value = value_for(schema, schema)
    assert value["n"] == 5 and value["x"] < 0 and 12 <= len(value["s"]) <= 20
    assert value["e"] == "b" and value["c"] == 3 and value["f"] is True
    assert value["when"] == "2026-01-01T00:00:00Z"
    assert value["list"] == [{"id": 1}, {"id": 1}, {"id": 1}]
    assert isinstance(value["pair"][0], str) and value["pair"][1] == 1
    assert value["either"] == 1 and value["both"] == {"p": True, "q": None}
    assert value_for(schema, schema) == value  # deterministic


def test_json_object_answers_an_object_of_words() -> None:
    assert answer_text({}, [" two", " words"]) == '{"answer":"two words"}'

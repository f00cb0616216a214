"""Errors and usage as each text shape's own clients read them: error answers under /v1/messages
in Anthropic's format (spec fields kept), the final error event of a stream in each shape's event
format, and the input-token counts of a messages stream (repeated in message_delta, billed once; the
gateway's count in message_start of a translated stream)."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import anthropic
import httpx
import pytest

from gateway.errors import ERROR_TABLE, MESSAGES_ERROR_TYPES, error_object
from harness import Gateway, KeyHandle, chat_model, eventually, gateway, request_logs

CLAUDE = "anthropic/claude-sonnet-4-5"
GPT = "openai/gpt-4o-mini"
RESPONSES = "openai/gpt-4.1-mini"
ANTHROPIC_TYPES = {
    "invalid_request_error",
    "authentication_error",
    "permission_error",
    "not_found_error",
    "request_too_large",
    "rate_limit_error",
    "api_error",
    "overloaded_error",
    "billing_error",
    "timeout_error",
}


def sse_events(body: bytes) -> list[tuple[str | None, dict[str, Any]]]:
    events = []
    for block in body.decode().strip().split("\n\n"):
        name, data = None, ""
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                data = line.removeprefix("data: ")
        if data and data != "[DONE]":
            events.append((name, json.loads(data)))
    return events


def stream(
    gw: Gateway, key: KeyHandle, path: str, body: dict[str, Any]
) -> list[tuple[str | None, dict[str, Any]]]:
    with gw.client(key.key) as c, c.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        return sse_events(b"".join(r.iter_bytes()))


def message_body(model: str, text: str) -> dict[str, Any]:
    return {"model": model, "max_tokens": 100, "messages": [{"role": "user", "content": text}]}


# ------------------------------------------------------------------ error answers under /v1/messages


def test_every_code_has_a_word_in_anthropics_vocabulary() -> None:
    for code, (_, spec_type) in ERROR_TABLE.items():
        word = error_object(code, "m", shape="messages")["type"]
        assert word in ANTHROPIC_TYPES, code
        if spec_type in ANTHROPIC_TYPES:  # already Anthropic's word: it stays (provider_overloaded too)
            assert word == spec_type
        else:
            assert word == MESSAGES_ERROR_TYPES[spec_type]


def test_messages_errors_are_anthropics_format_with_the_spec_fields(gw: Gateway, key: KeyHandle) -> None:
    poor = gw.new_key(balance="0")
    body = message_body(CLAUDE, "hi")
    cases = [
        (
            httpx.post(gw.url + "/v1/messages", json=body, timeout=30),
            401,
            "authentication_error",
            "invalid_api_key",
        ),
        (
            httpx.post(gw.url + "/v1/messages", json=body, headers={"x-api-key": "sk-nope"}, timeout=30),
            401,
            "authentication_error",
            "invalid_api_key",
        ),
        (
            httpx.post(
                gw.url + "/v1/messages/batches", json=body, headers={"x-api-key": key.key}, timeout=30
            ),
            404,
            "not_found_error",
            "not_found",
        ),
        (
            httpx.get(gw.url + "/v1/messages", headers={"x-api-key": key.key}, timeout=30),
            405,
            "invalid_request_error",
            "method_not_allowed",
        ),
        (
            httpx.post(
                gw.url + "/v1/messages",
                json={**body, "model": "nope/nope"},
                headers={"x-api-key": key.key},
                timeout=30,
            ),
            400,
            "not_found_error",
            "model_not_found",
        ),
        (
            httpx.post(
                gw.url + "/v1/messages",
                json={**body, "max_tokens": 0},
                headers={"x-api-key": key.key},
                timeout=30,
            ),
            400,
            "invalid_request_error",
            "invalid_request",
        ),
        (
            httpx.post(gw.url + "/v1/messages", json=body, headers={"x-api-key": poor.key}, timeout=30),
            400,
            "billing_error",
            "insufficient_credits",
        ),
    ]
    for r, status, type_, code in cases:
        assert r.status_code == status, r.text
        answer = r.json()
        assert answer["type"] == "error", answer
        error = answer["error"]
        assert (error["type"], error["code"]) == (type_, code), answer
        assert isinstance(error["message"], str) and error["message"] and "param" in error


def test_the_log_keeps_the_body_the_client_got(
    sim_url: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Spec 7.5.3: the request log has the error answer as it was sent, Anthropic's format here."""
    token_env, token = "GATEWAY_TEST_ADMIN_TOKEN", "admin-" + "0123456789abcdef" * 3
    config = chat_model(CLAUDE, "claude-sonnet-4-5", sim_url, type_="messages", provider="anthropic")
    config += f'\n[admin]\ntoken_env = "{token_env}"\n'
    with (
        gateway(tmp_path_factory.mktemp("errlog"), config, env={token_env: token}) as g,
        g.admin(token) as admin,
    ):
        handle = g.new_key()
        r = httpx.post(
            g.url + "/v1/messages",
            json={**message_body("nope/nope", "hi")},
            headers={"x-api-key": handle.key},
            timeout=30,
        )
        assert r.status_code == 400 and r.json()["type"] == "error"
        [entry] = request_logs(admin, handle.key_id, 1)
        full = admin.get(f"/logs/{entry['id']}").json()
    assert json.loads(full["response_body"]["data"]) == r.json()


def test_the_anthropic_client_reads_the_error(gw: Gateway) -> None:
    with (
        anthropic.Anthropic(base_url=gw.url, api_key="sk-nope", max_retries=0) as client,
        pytest.raises(anthropic.AuthenticationError) as caught,
    ):
        client.messages.create(model=CLAUDE, max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    body: Any = caught.value.body
    assert body["type"] == "error"
    assert body["error"]["type"] == "authentication_error" and body["error"]["code"] == "invalid_api_key"
    assert "Invalid API key" in caught.value.message


def test_other_paths_keep_the_spec_error_object(gw: Gateway) -> None:
    r = httpx.post(gw.url + "/v1/chat/completions", json={"model": GPT, "messages": []}, timeout=30)
    assert r.status_code == 401
    assert r.json() == {
        "error": {
            "message": r.json()["error"]["message"],
            "type": "authentication_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }
    r = httpx.get(gw.url + "/v1/messagesx", timeout=30)
    assert r.status_code == 404 and "type" not in r.json() and r.json()["error"]["type"] == "not_found_error"


# ------------------------------------------------------------------ the final error event of a stream


@pytest.mark.parametrize("model", [CLAUDE, GPT])
def test_messages_stream_error_is_anthropics_error_event(gw: Gateway, key: KeyHandle, model: str) -> None:
    events = stream(gw, key, "/v1/messages", message_body(model, "x [sim tokens=8 error_after=2]"))
    name, data = events[-1]
    assert name == "error"
    assert data.pop("id") == events[-2][1]["id"]  # the stream's id, as on every event (spec 6.1.6)
    assert data == {
        "type": "error",
        "error": {
            "message": "The model failed during the stream.",
            "type": "api_error",
            "param": None,
            "code": "provider_error",
        },
    }
    assert [n for n, _ in events].count("content_block_delta") == 2


def test_responses_stream_error_is_openais_error_event(gw: Gateway, key: KeyHandle) -> None:
    events = stream(gw, key, "/v1/responses", {"model": RESPONSES, "input": "[sim tokens=8 error_after=3]"})
    name, data = events[-1]
    assert name == "error"
    numbers = [d["sequence_number"] for _, d in events[:-1]]
    assert numbers == list(range(len(numbers)))
    assert data.pop("id") == events[-2][1]["id"]
    assert data == {
        "type": "error",
        "code": "provider_error",
        "message": "The model failed during the stream.",
        "param": None,
        "sequence_number": len(numbers),
        "error": {
            "message": "The model failed during the stream.",
            "type": "api_error",
            "param": None,
            "code": "provider_error",
        },
    }


@pytest.mark.parametrize("model", [GPT, CLAUDE])
def test_chat_stream_error_stays_the_spec_chunk(gw: Gateway, key: KeyHandle, model: str) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": "x [sim tokens=8 error_after=2]"}]}
    events = stream(gw, key, "/v1/chat/completions", body)
    name, data = events[-1]
    assert name is None
    assert data.pop("id") == events[-2][1]["id"]
    assert data == {
        "error": {
            "message": "The model failed during the stream.",
            "type": "api_error",
            "param": None,
            "code": "provider_error",
        }
    }


# ------------------------------------------------------------------ input tokens of a messages stream


def usage_record(gw: Gateway, key: KeyHandle, response_id: str) -> dict[str, Any]:
    with gw.client(key.key) as c:

        def found() -> httpx.Response | None:
            r = c.get(f"/v1/usage/{response_id}")
            return r if r.status_code == 200 else None

        r = eventually(found, step=0.05, what=f"the usage record {response_id}")
    assert r.status_code == 200, r.text
    record: dict[str, Any] = r.json()
    return record


def test_input_repeated_in_message_delta_is_shown_and_billed_once(gw: Gateway, key: KeyHandle) -> None:
    events = stream(gw, key, "/v1/messages", message_body(CLAUDE, "count me [sim tokens=5]"))
    start = events[0][1]["message"]["usage"]
    delta = next(d for n, d in events if n == "message_delta")["usage"]
    assert start["input_tokens"] > 0
    for field in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"):
        assert delta[field] == start[field]  # as Anthropic repeats them (langchain-anthropic reads them here)
    record = usage_record(gw, key, events[0][1]["id"])
    assert record["usage"]["prompt_tokens"] == start["input_tokens"]
    assert record["usage"]["completion_tokens"] == delta["output_tokens"] == 5
    expected = Decimal("2.50") * start["input_tokens"] / 10**6 + Decimal(10) * 5 / 10**6
    assert abs(Decimal(str(record["cost"])) - expected) <= expected / 1000


def test_translated_messages_stream_counts_the_prompt_in_message_start(gw: Gateway, key: KeyHandle) -> None:
    with anthropic.Anthropic(base_url=gw.url, api_key=key.key, max_retries=0) as client:
        events = stream(
            gw, key, "/v1/messages", message_body(GPT, "a prompt of several words [sim tokens=4]")
        )
        start = events[0][1]["message"]["usage"]
        end = next(d for n, d in events if n == "message_delta")["usage"]
        # The gateway's own count, close to the chat upstream's (which counts its own framing).
        assert start["input_tokens"] > 0 and abs(start["input_tokens"] - end["input_tokens"]) <= 8
        assert start["output_tokens"] == 0
        with client.messages.stream(**message_body(GPT, "hello [sim tokens=3]")) as s:
            first = next(iter(s))
            assert first.type == "message_start" and first.message.usage.input_tokens > 0
            final = s.get_final_message()
    assert final.usage.output_tokens == 3

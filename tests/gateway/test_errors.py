"""Every failure is the spec's error object with the right status and code (spec 5, 6.1.7, 7)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any, get_args

import httpx
import openai
import orjson
import pytest

from gateway.core import json_nesting_depth
from gateway.errors import ERROR_TABLE, ErrorCode
from gateway.providers.base import stream_failure
from harness import Gateway, KeyHandle, eventually

CHAT = "/v1/chat/completions"


def chat_body(content: str = "hi", **extra: object) -> dict[str, object]:
    return {"model": "openai/gpt-4o-mini", "messages": [{"role": "user", "content": content}], **extra}


def test_the_error_code_type_names_exactly_the_table() -> None:
    # ErrorCode is what type checking holds every raised code to; the table is what renders them.
    assert list(get_args(ErrorCode)) == list(ERROR_TABLE)


def assert_error(r: httpx.Response, status: int, code: str, type_: str) -> dict[str, object]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    error = r.json()["error"]
    assert error["code"] == code
    assert error["type"] == type_
    assert isinstance(error["message"], str) and error["message"]
    assert "param" in error
    return dict(error)


@pytest.mark.slow
def test_a_connection_that_sends_nothing_is_closed(gw: Gateway) -> None:
    """Hostile review: one that never sent a byte stayed open for good (Granian's automatic
    HTTP/1-or-2 mode waits for a first byte with no deadline), where headers that stop arriving
    are cut after 30 s. It is cut the same way now; HTTP/2's preface is not an HTTP/1.1 request."""
    url = httpx.URL(gw.url)
    with socket.create_connection((url.host, url.port)) as silent:
        silent.settimeout(45)
        started = time.monotonic()
        assert silent.recv(100) == b""
        assert 25 < time.monotonic() - started < 45
    with socket.create_connection((url.host, url.port)) as h2c:
        h2c.settimeout(10)
        h2c.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        assert not h2c.recv(100).startswith(b"\x00")  # no HTTP/2 frame: a refusal, or closed


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"authorization": "Bearer sk-unknown"},
        {"authorization": "Bearer nope"},
        {"authorization": "Basic x"},
    ],
)
def test_missing_or_unknown_key_is_401_without_request_id(gw: Gateway, headers: dict[str, str]) -> None:
    r = httpx.post(gw.url + CHAT, json=chat_body(), headers=headers)
    assert_error(r, 401, "invalid_api_key", "authentication_error")
    assert "x-service-request-id" not in r.headers


def test_deleted_key_stops_working(gw: Gateway) -> None:
    handle = gw.new_key()
    with gw.client(handle.key) as c:
        assert c.post(CHAT, json=chat_body()).status_code == 200
        gw.delete_key(handle.key_id)
        assert_error(c.post(CHAT, json=chat_body()), 401, "invalid_api_key", "authentication_error")


def test_expired_key(gw: Gateway) -> None:
    handle = gw.new_key(expires_at_ms=time.time_ns() // 1_000_000 - 1000)
    with gw.client(handle.key) as c:
        r = c.post(CHAT, json=chat_body())
    assert_error(r, 401, "key_expired", "authentication_error")
    assert "x-service-request-id" not in r.headers


def test_openai_client_raises_authentication_error(gw: Gateway) -> None:
    with (
        openai.OpenAI(base_url=gw.openai_base, api_key="sk-wrong", max_retries=0) as c,
        pytest.raises(openai.AuthenticationError) as info,
    ):
        c.chat.completions.create(model="openai/gpt-4o-mini", messages=[{"role": "user", "content": "x"}])
    assert info.value.code == "invalid_api_key"


def test_unknown_model(gw: Gateway, key: KeyHandle) -> None:
    with gw.client(key.key) as c:
        r = c.post(CHAT, json={**chat_body(), "model": "nobody/nothing"})
    error = assert_error(r, 400, "model_not_found", "not_found_error")
    assert error["param"] == "model"
    assert r.headers["x-service-request-id"].startswith("req_")


def test_a_bare_model_name_is_the_endpoint_vendors(gw: Gateway, key: KeyHandle) -> None:
    """On /v1/messages a name without a prefix is Anthropic's model of that name (LiteLLM's
    `anthropic/...` sends it stripped); on the OpenAI-shaped endpoints it is not."""
    with gw.client(key.key) as c:
        message = c.post("/v1/messages", json={**chat_body(), "model": "claude-sonnet-4-5", "max_tokens": 8})
        r = c.post(CHAT, json={**chat_body(), "model": "claude-sonnet-4-5"})
    assert message.status_code == 200, message.text
    assert message.json()["type"] == "message"
    assert_error(r, 400, "model_not_found", "not_found_error")
    # The model lookups speak OpenAI's API: a bare name there is OpenAI's model, as on chat.
    with gw.client(key.key) as c:
        retrieved = c.get("/v1/models/gpt-4o-mini")
        info = c.get("/model_group/info", params={"model_group": "gpt-4o-mini"})
    assert retrieved.status_code == 200 and retrieved.json()["id"] == "openai/gpt-4o-mini"
    assert info.status_code == 200 and len(info.json()["data"]) == 1


def test_unknown_path_and_wrong_method(gw: Gateway, key: KeyHandle) -> None:
    with gw.client(key.key) as c:
        assert_error(c.get("/v1/nothing/here"), 404, "not_found", "not_found_error")
        wrong = c.get(CHAT)
        videos = c.put("/v1/videos")
    assert_error(wrong, 405, "method_not_allowed", "invalid_request_error")
    assert wrong.headers["allow"] == "POST"
    # Every method the path serves, whichever route serves it.
    assert_error(videos, 405, "method_not_allowed", "invalid_request_error")
    assert videos.headers["allow"] == "GET, HEAD, POST"


def test_a_websocket_upgrade_is_answered_as_plain_http(gw: Gateway, key: KeyHandle) -> None:
    """Review: no endpoint speaks WebSocket, and an upgrade request got the server's empty 403.
    It is an HTTP request like any other now: its path answers it, errors in the spec's format."""
    upgrade = {
        "connection": "Upgrade",
        "upgrade": "websocket",
        "sec-websocket-version": "13",
        "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==",
    }
    with gw.client(key.key) as c:
        models = c.get("/v1/models", headers=upgrade)
        nowhere = c.get("/v1/nothing/here", headers=upgrade)
    assert models.status_code == 200 and models.json()["object"] == "list"
    assert_error(nowhere, 404, "not_found", "not_found_error")


@pytest.mark.parametrize(
    ("content", "param"),
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        (b'{"model": "openai/gpt-4o-mini"}', "messages"),
        (b'{"model": "openai/gpt-4o-mini", "messages": []}', "messages"),
        (b'{"model": "openai/gpt-4o-mini", "messages": ["x"]}', "messages"),
        (
            b'{"model": "openai/gpt-4o-mini", "messages": [{"role": "user", "content": "x"}],'
            b' "stream": "yes"}',
            "stream",
        ),
        (b'{"messages": [{"role": "user", "content": "x"}]}', "model"),
        (b"\xff\xfe", None),
        # What bounds the hold must be a count (an upstream taking "8" for n would make eight).
        (b'{"model": "openai/gpt-4o-mini", "messages": [{"role": "user", "content": "x"}], "n": "2"}', "n"),
        (b'{"model": "openai/gpt-4o-mini", "messages": [{"role": "user", "content": "x"}], "n": 0}', "n"),
        # As OpenAI's API: at most 128 choices (a billion is malformed, not a balance too small).
        (b'{"model": "openai/gpt-4o-mini", "messages": [{"role": "user", "content": "x"}], "n": 129}', "n"),
        (b'{"model": "openai/gpt-4o-mini", "messages": [{"role": "user", "content": "x"}], "n": 1e9}', "n"),
        (
            b'{"model": "openai/gpt-4o-mini", "messages": [{"role": "user", "content": "x"}],'
            b' "max_tokens": "10"}',
            "max_tokens",
        ),
        (
            b'{"model": "openai/gpt-4o-mini", "messages": [{"role": "user", "content": "x"}],'
            b' "max_tokens": 1.5}',
            "max_tokens",
        ),
        (
            b'{"model": "openai/gpt-4o-mini", "messages": [{"role": "user", "content": "x"}],'
            b' "max_completion_tokens": -5, "max_tokens": 10}',
            "max_completion_tokens",
        ),
        (
            b'{"model": "openai/gpt-4o-mini", "messages": [{"role": "user", "content": "x"}],'
            b' "max_tokens": true}',
            "max_tokens",
        ),
        (
            b'{"model": "openai/gpt-4o-mini", "messages": [{"role": "user", "content": "x"}],'
            b' "stream": true, "stream_options": {"include_usage": "yes"}}',
            "stream_options.include_usage",
        ),
    ],
)
def test_malformed_requests(gw: Gateway, key: KeyHandle, content: bytes, param: str | None) -> None:
    with gw.client(key.key) as c:
        r = c.post(CHAT, content=content, headers={"content-type": "application/json"})
    assert assert_error(r, 400, "invalid_request", "invalid_request_error")["param"] == param


def nest(levels: int) -> object:
    """A value `levels` objects deep."""
    value: object = 1
    for _ in range(levels):
        value = {"a": value}
    return value


NESTED_BODIES: dict[str, tuple[str, Callable[[int], dict[str, object]]]] = {
    # Where deep nesting went wrong: the Rust core's parse of the messages (128 levels), orjson's
    # encoder of a forwarded field (255), a translation to another shape.
    "chat content part": (
        CHAT,
        lambda k: chat_body(content=[{"type": "text", "text": "hi", "x": nest(k - 5)}]),  # type: ignore[arg-type]
    ),
    "chat metadata": (CHAT, lambda k: chat_body(metadata=nest(k - 1))),
    "chat tool schema": (
        CHAT,
        lambda k: chat_body(
            tools=[{"type": "function", "function": {"name": "f", "parameters": nest(k - 4)}}]
        ),
    ),
    "messages tool schema, translated": (
        "/v1/messages",
        lambda k: {
            "model": "openai/gpt-4o-mini",
            "max_tokens": 16,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"name": "f", "input_schema": nest(k - 3)}],
        },
    ),
    "embeddings": (
        "/v1/embeddings",
        lambda k: {"model": "openai/text-embedding-3-small", "input": "hi", "x": nest(k - 1)},
    ),
}


@pytest.mark.parametrize("where", list(NESTED_BODIES))
def test_nesting_past_the_limit_is_400_and_up_to_it_runs(gw: Gateway, key: KeyHandle, where: str) -> None:
    """A body nested deeper than 100 levels is refused 400 invalid_request before anything reads
    it; one nested 100 levels deep runs. Before, 123 levels in a message or 255 in a forwarded
    field got a 500 from whatever read the body after the parse."""
    path, build = NESTED_BODIES[where]
    assert json_nesting_depth(orjson.dumps(build(100)), 1000) == 100  # the core's scan: tests/core
    with gw.client(key.key) as c:
        for levels in (101, 130, 300):
            refused = c.post(path, json=build(levels))
            assert refused.status_code == 400, refused.text
            assert refused.json()["error"]["code"] == "invalid_request"
            assert "deeper than 100 levels" in refused.json()["error"]["message"]
        served = c.post(path, json=build(100))
    assert served.status_code == 200, served.text


@pytest.mark.parametrize("stream", [False, True])
def test_a_key_given_twice_is_its_last_value(gw: Gateway, key: KeyHandle, stream: bool) -> None:
    """Hostile review: `messages`, `tools`, `functions` or `response_format` given twice was a 500
    (the prompt's count refused a duplicate field) where every other field's last value is taken,
    as JSON readers generally take it."""
    said = b'[{"role":"user","content":"twice"}]'
    body = (
        b'{"model":"openai/gpt-4o-mini","messages":[],"messages":' + said + b',"tools":[],"tools":[],'
        b'"functions":null,"functions":null,"response_format":{"type":"text"},"response_format":null,'
        b'"stream":' + (b"true" if stream else b"false") + b"}"
    )
    with gw.client(key.key) as c:
        r = c.post(CHAT, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text


def test_null_counts_are_unset(gw: Gateway, key: KeyHandle) -> None:
    with gw.client(key.key) as c:
        r = c.post(CHAT, json=chat_body(n=None, max_tokens=None, max_completion_tokens=None))
    assert r.status_code == 200, r.text


def test_no_credits(gw: Gateway) -> None:
    broke = gw.new_key(balance="0")
    with gw.client(broke.key) as c:
        r = c.post(CHAT, json=chat_body())
    assert_error(r, 400, "insufficient_credits", "insufficient_credits")


def test_upstream_500_is_provider_error_and_not_charged(gw: Gateway, key: KeyHandle) -> None:
    before = gw.balance(key.account_id)
    with gw.client(key.key) as c:
        r = c.post(CHAT, json=chat_body("[sim fail=500]"))
    assert_error(r, 502, "provider_error", "api_error")
    assert gw.balance(key.account_id) == before


@pytest.mark.parametrize("status", [200, 302])
@pytest.mark.parametrize(
    ("path", "body"),
    [
        (CHAT, {"model": "openai/gpt-4o-mini", "messages": [{"role": "user", "content": "hi {}"}]}),
        (CHAT, {"model": "anthropic/claude-sonnet-4-5", "messages": [{"role": "user", "content": "hi {}"}]}),
        (
            "/v1/messages",
            {
                "model": "openai/gpt-4o-mini",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "hi {}"}],
            },
        ),
        (
            "/v1/messages",
            {
                "model": "anthropic/claude-sonnet-4-5",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "hi {}"}],
            },
        ),
        ("/v1/responses", {"model": "openai/gpt-4.1-mini", "input": "hi {}"}),
        ("/v1/audio/speech", {"model": "openai/tts-1", "voice": "alloy", "input": "hi {}"}),
    ],
)
def test_an_upstream_failure_said_with_a_2xx_or_3xx_is_provider_error_and_not_charged(
    gw: Gateway, path: str, body: dict[str, Any], status: int
) -> None:
    """An upstream that answers its failure with 200 and an error body, or redirects (which the
    gateway does not follow): the model failed, 502 and nothing charged, never a result (review:
    a charged 200 carrying the error body, or audio that was the error's JSON)."""
    key = gw.new_key()
    before = gw.balance(key.account_id)
    marked = orjson.loads(orjson.dumps(body).replace(b"{}", f"[sim fail={status}]".encode()))
    with gw.client(key.key) as c:
        r = c.post(path, json=marked)
    assert r.status_code == 502, (r.status_code, r.headers.get("content-type"), r.content[:200])
    assert r.json()["error"]["code"] == "provider_error"
    assert "x-service-cost" not in r.headers
    assert gw.balance(key.account_id) == before


def test_upstream_503_keeps_its_status_family(gw: Gateway, key: KeyHandle) -> None:
    with gw.client(key.key) as c:
        assert_error(c.post(CHAT, json=chat_body("[sim fail=503]")), 503, "provider_error", "api_error")


def test_upstream_429_is_provider_overloaded_with_retry_after(gw: Gateway, key: KeyHandle) -> None:
    with gw.client(key.key) as c:
        r = c.post(CHAT, json=chat_body("[sim fail=429]"))
    assert_error(r, 429, "provider_overloaded", "rate_limit_error")
    assert r.headers["retry-after"] == "1"


def test_upstream_400_is_invalid_request(gw: Gateway, key: KeyHandle) -> None:
    """With the field the provider named (media review: `param` was dropped); not when the request
    was translated for the model, whose field names are not the client's."""
    with gw.client(key.key) as c:
        r = c.post(CHAT, json=chat_body("[sim fail=400]"))
        translated = c.post("/v1/responses", json={"model": "openai/gpt-4o-mini", "input": "[sim fail=400]"})
        images = c.post(
            "/v1/images/generations",
            json={"model": "openai/gpt-image-1", "prompt": "x", "output_format": "webp"},
        )
    assert assert_error(r, 400, "invalid_request", "invalid_request_error")["param"] == "messages"
    assert assert_error(translated, 400, "invalid_request", "invalid_request_error")["param"] is None
    assert assert_error(images, 400, "invalid_request", "invalid_request_error")["param"] == "output_format"


def test_stream_error_before_first_token_is_plain_json(gw: Gateway, key: KeyHandle) -> None:
    with gw.client(key.key) as c:
        r = c.post(CHAT, json=chat_body("[sim fail=500]", stream=True))
    assert_error(r, 502, "provider_error", "api_error")


def stream_events(gw: Gateway, key: KeyHandle, content: str) -> list[bytes]:
    with gw.client(key.key) as c, c.stream("POST", CHAT, json=chat_body(content, stream=True)) as r:
        assert r.status_code == 200
        body = b"".join(r.iter_bytes())
    return [e for e in body.split(b"\n\n") if e]


def test_stream_error_after_start_is_final_error_chunk(gw: Gateway, key: KeyHandle) -> None:
    events = stream_events(gw, key, "[sim tokens=10 error_after=3]")
    assert b'"error"' in events[-1]
    assert events[-1].startswith(b"data: {")
    assert b"[DONE]" not in b"".join(events)
    assert b'"code":"provider_error"' in events[-1]


def test_stream_dropped_upstream_ends_with_error_chunk(gw: Gateway, key: KeyHandle) -> None:
    events = stream_events(gw, key, "[sim tokens=10 drop_after=4]")
    assert b'"code":"provider_error"' in events[-1]
    content = [e for e in events[:-1] if b'"content":" ' in e]
    assert len(content) == 4


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (
            b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}',
            "provider_overloaded",
        ),
        (b'{"type":"error","error":{"type":"rate_limit_error","message":"slow"}}', "provider_overloaded"),
        (
            b'{"error":{"message":"x","type":"throttlingException","param":null,"code":null}}',
            "provider_overloaded",
        ),
        (b'{"error":{"message":"x","type":"tokens","code":"rate_limit_exceeded"}}', "provider_overloaded"),
        (b'{"type":"error","code":"rate_limit_exceeded","message":"x"}', "provider_overloaded"),
        (
            b'{"type":"response.failed","response":{"error":{"code":"rate_limit_exceeded"}}}',
            "provider_overloaded",
        ),
        (b'{"error":{"code":429,"status":"RESOURCE_EXHAUSTED"}}', "provider_overloaded"),
        (b'{"type":"error","error":{"type":"api_error","message":"Internal"}}', "provider_error"),
        # A refusal under the provider's content policy: the same refusal on every channel.
        (
            b'{"error":{"message":"blocked","type":"server_error","code":"content_filter"}}',
            "content_filtered",
        ),
        (
            b'{"type":"error","error":{"type":"invalid_request_error",'
            b'"message":"Output blocked by content filtering policy"}}',
            "content_filtered",
        ),
        # Fields of types no provider sends: read as nothing, never a failure of the gateway's own.
        (b'{"error":{"message":"x","type":["server_error"],"code":{"a":1}}}', "provider_error"),
        (b'{"error":{"message":"x","type":"server_error"}}', "provider_error"),
        (b"not json", "provider_error"),
        (b"[1]", "provider_error"),
        (None, "provider_error"),
    ],
)
def test_a_stream_failing_before_its_first_token(error: bytes | None, code: str) -> None:
    """The error event a stream ended on before any output: at capacity is the provider's 429 (other
    channels, a cool-down), anything else a failure another attempt may get past."""
    failure = stream_failure(error)
    assert failure.code == code
    if code == "provider_overloaded":
        assert failure.retry == "other" and failure.headers.get("retry-after") == "1"
    elif code == "content_filtered":
        assert failure.retry is None and failure.status == 400  # not retried; the channel works
    else:
        assert failure.retry == "any"


def test_failures_outside_the_model_endpoints_are_logged_for_their_key(gw: Gateway) -> None:
    """Spec 7.5.3: every failure is in the logs with its status and answer, a usage lookup's 404,
    an unknown path and a wrong method too (model requests log themselves)."""
    handle = gw.new_key()
    with gw.client(handle.key) as c:
        answers = [
            c.get("/v1/usage/req_nothing"),
            c.get("/v1/nothing/here"),
            c.get(CHAT),
            c.get("/v1/models/no/such"),
        ]
    expected = {(r.status_code, r.json()["error"]["code"], r.request.url.path) for r in answers}
    assert {(s, code) for s, code, _ in expected} == {
        (404, "not_found"),
        (405, "method_not_allowed"),
        (400, "model_not_found"),
    }

    def logged() -> set[tuple[int, str, str]] | None:
        rows = gw.query("SELECT status, error_code, path FROM request_logs WHERE key_id = ?", handle.key_id)
        found = {(status, code, path) for status, code, path in rows}
        return found if found == expected else None

    eventually(logged, what=f"the failures of {handle.key_id} in the logs")
    # Each answer names its entry, for the client to quote (spec 7.3.2; review: they had no id).
    ids = {r.headers.get("x-service-request-id") for r in answers}
    rows = gw.query("SELECT id FROM request_logs WHERE key_id = ?", handle.key_id)
    assert ids == {row_id for (row_id,) in rows} and None not in ids
    rows = gw.query("SELECT response_body FROM request_logs WHERE key_id = ?", handle.key_id)
    assert all(b'"error"' in bytes(body) for (body,) in rows)


@pytest.mark.parametrize("version", ["1.1", "1.0"])
def test_a_request_with_two_hosts_is_400(gw: Gateway, version: str) -> None:
    """Protocol review: a request with two Host lines was served and billed; RFC 9112 3.2 answers
    it 400 (a proxy in front may have read the other one)."""
    port = int(gw.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            f"POST /v1/chat/completions HTTP/{version}\r\nHost: a\r\nHost: b\r\nContent-Length: 2\r\n"
            "Connection: close\r\n\r\n{}".encode()
        )
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b" ")[1] == b"400", answer
    assert orjson.loads(body)["error"]["code"] == "invalid_request" and b"Host" in body

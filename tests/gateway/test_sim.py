"""The simulator itself: directives, the OpenAI wire format, determinism and max_tokens."""

from __future__ import annotations

import httpx
import pytest

from gateway.sim.directives import DirectiveError, parse


def test_directive_sources_and_precedence() -> None:
    model, d = parse("gpt-x+tokens=3+ttft=200ms", "pace=5ms, tokens=4", "hello [sim tokens=5 fail=503]")
    assert model == "gpt-x"
    assert (d.tokens, d.ttft, d.pace, d.fail) == (5, 0.2, 0.005, 503)


@pytest.mark.parametrize("bad", ["+tokens", "+bogus=1", "+tokens=many"])
def test_bad_directives(bad: str) -> None:
    with pytest.raises(DirectiveError):
        parse("m" + bad, None, None)


def test_plain_answer_is_deterministic_and_honours_max_tokens(sim: httpx.Client) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "same"}], "max_tokens": 4}
    a = sim.post("/v1/chat/completions", json=body).json()
    b = sim.post("/v1/chat/completions", json=body).json()
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
    assert a["usage"]["completion_tokens"] == 4
    assert a["choices"][0]["finish_reason"] == "length"
    assert a["object"] == "chat.completion"


def test_reasoning_counts_inside_the_output_limit_of_every_shape(sim: httpx.Client) -> None:
    """As every API counts it (review: `reasoning=3000` with max_tokens 20 was 3010 tokens)."""
    said = "think [sim tokens=10 reasoning=3000]"
    chat = sim.post(
        "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": said}], "max_completion_tokens": 20},
    ).json()
    assert chat["usage"]["completion_tokens"] == 20 and chat["choices"][0]["finish_reason"] == "length"
    assert chat["usage"]["completion_tokens_details"]["reasoning_tokens"] == 20
    responses = sim.post("/v1/responses", json={"model": "m", "input": said, "max_output_tokens": 25}).json()
    assert responses["usage"]["output_tokens"] == 25
    messages = sim.post(
        "/v1/messages", json={"model": "m", "max_tokens": 30, "messages": [{"role": "user", "content": said}]}
    ).json()
    assert messages["usage"]["output_tokens"] <= 30 and messages["stop_reason"] == "max_tokens"
    roomy = sim.post(
        "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": said}], "max_completion_tokens": 3005},
    ).json()
    assert roomy["usage"]["completion_tokens"] == 3005  # the reasoning whole, the answer cut to 5


def test_stream_format_with_usage(sim: httpx.Client) -> None:
    body = {
        "model": "m+tokens=3",
        "messages": [{"role": "user", "content": "s"}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with sim.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    assert '"usage":{"prompt_tokens"' in events[-2]
    assert sum('"content":" ' in e for e in events) == 3


def test_fail_directive_uses_openai_error_format(sim: httpx.Client) -> None:
    r = sim.post(
        "/v1/chat/completions", json={"model": "m+fail=429", "messages": [{"role": "user", "content": "x"}]}
    )
    assert r.status_code == 429
    assert r.headers["retry-after"] == "1"
    assert r.json()["error"]["type"] == "rate_limit_error"


def test_keep_alive_serves_many_requests_on_one_connection(sim: httpx.Client) -> None:
    for _ in range(20):
        assert sim.get("/_sim/health").status_code == 200


def test_a_chunked_request_body_is_read_whole(sim: httpx.Client) -> None:
    body = b'{"model": "m", "input": ["one", "two"], "dimensions": 4}'
    pieces = (body[i : i + 7] for i in range(0, len(body), 7))  # a generator: httpx sends it chunked
    r = sim.post("/v1/embeddings", content=pieces, headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    assert [len(d["embedding"]) for d in r.json()["data"]] == [4, 4]


def test_routes_match_under_any_prefix(sim: httpx.Client) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    for prefix in ("", "/v1", "/api/v1", "/a/b/c"):
        assert sim.post(prefix + "/chat/completions", json=body).status_code == 200
    assert sim.post("/v1/xchat/completions", json=body).status_code == 404


def test_unknown_paths_and_methods_are_answered_in_the_provider_format(sim: httpx.Client) -> None:
    r = sim.get("/v1/nowhere")
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "unknown_url"
    r = sim.get("/v1/chat/completions")
    assert (r.status_code, r.json()["error"]["message"]) == (405, "Use POST.")
    r = sim.get("/v1/messages")
    assert r.status_code == 405
    assert r.json()["type"] == "error"  # Anthropic's format


def test_drop_after_cuts_the_connection_mid_stream(sim: httpx.Client) -> None:
    body = {
        "model": "m+tokens=5+drop_after=2",
        "messages": [{"role": "user", "content": "s"}],
        "stream": True,
    }
    seen: list[str] = []
    with pytest.raises(httpx.RemoteProtocolError), sim.stream("POST", "/v1/chat/completions", json=body) as r:
        seen.extend(line for line in r.iter_lines() if line)
    assert sum('"content":" ' in e for e in seen) == 2


def test_error_after_ends_the_stream_with_an_error_event(sim: httpx.Client) -> None:
    body = {
        "model": "m+tokens=5+error_after=1",
        "messages": [{"role": "user", "content": "s"}],
        "stream": True,
    }
    with sim.stream("POST", "/v1/chat/completions", json=body) as r:
        events = [line for line in r.iter_lines() if line]
    assert '"error":{"message":"Simulated failure mid-stream."' in events[-1]
    assert sum('"content":" ' in e for e in events) == 1

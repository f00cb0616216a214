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

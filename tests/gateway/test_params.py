"""Spec 1.3: unsupported parameters are dropped, supported ones always reach the model, nothing is
rewritten; /model_group/info lists exactly what is forwarded. The simulator's record is the proof."""

from __future__ import annotations

import os

import httpx
import pytest

from harness import Gateway, KeyHandle, sim_requests


def send(gw: Gateway, key: KeyHandle, model: str, **params: object) -> tuple[str, httpx.Response]:
    marker = "marker-" + os.urandom(6).hex()
    with gw.client(key.key) as c:
        r = c.post(
            "/v1/chat/completions",
            json={"model": model, "messages": [{"role": "user", "content": marker}], **params},
        )
    return marker, r


@pytest.mark.parametrize(
    ("model", "upstream", "arrives", "dropped"),
    [
        ("openai/gpt-4o-mini", "gpt-4o-mini", "logit_bias", "top_k"),
        ("meta/llama-3.1-8b", "llama-3.1-8b", "top_k", "logit_bias"),
    ],
)
def test_top_k_and_logit_bias_succeed_on_both_families(
    gw: Gateway, key: KeyHandle, sim: httpx.Client, model: str, upstream: str, arrives: str, dropped: str
) -> None:
    marker, r = send(gw, key, model, top_k=5, logit_bias={"50256": -100}, temperature=0.5)
    assert r.status_code == 200, r.text
    (received,) = sim_requests(sim, marker)
    assert arrives in received
    assert dropped not in received
    assert received["temperature"] == 0.5
    assert received["model"] == upstream
    # Nothing rewritten: what arrives is what was sent.
    assert received[arrives] == {"top_k": 5, "logit_bias": {"50256": -100}}[arrives]
    assert received["messages"] == [{"role": "user", "content": marker}]


def test_model_group_info_lists_exactly_what_is_forwarded(
    gw: Gateway, key: KeyHandle, sim: httpx.Client
) -> None:
    with gw.client(key.key) as c:
        info = c.get("/model_group/info", params={"model_group": "meta/llama-3.1-8b"}).json()
    params = info["data"][0]["supported_openai_params"]
    assert params == sorted(["max_tokens", "stream", "stream_options", "temperature", "top_k", "top_p"])
    everything = {p: 1 for p in ["top_k", "top_p", "seed", "n", "logprobs", "user", "presence_penalty"]}
    marker, r = send(gw, key, "meta/llama-3.1-8b", max_tokens=3, **everything)
    assert r.status_code == 200
    (received,) = sim_requests(sim, marker)
    assert set(received) - {"model", "messages"} == {"max_tokens", "top_k", "top_p"}


@pytest.mark.parametrize(
    ("model", "required", "not_listed"),
    [
        ("anthropic/claude-sonnet-4-5", "max_tokens", "messages"),
        ("openai/gpt-4.1-mini", "previous_response_id", "input"),
        ("openai/tts-1", "voice", "input"),
        ("cohere/rerank-v3.5", "top_n", "documents"),
    ],
)
def test_model_group_info_lists_the_parameters_a_type_requires(
    gw: Gateway, key: KeyHandle, model: str, required: str, not_listed: str
) -> None:
    """Spec review: a parameter every request of the type carries, forwarded as it came (a message
    request's max_tokens, previous_response_id), was missing from the list; the request itself (the
    model, its messages, input or documents) is not a parameter."""
    with gw.client(key.key) as c:
        info = c.get("/model_group/info", params={"model_group": model}).json()
    params = info["data"][0]["supported_openai_params"]
    assert required in params and not_listed not in params and "model" not in params, params


def test_model_group_info_unknown_model(gw: Gateway, key: KeyHandle) -> None:
    with gw.client(key.key) as c:
        r = c.get("/model_group/info", params={"model_group": "no/such"})
        empty = c.get("/model_group/info", params={"model_group": ""})
    assert r.status_code == 400
    assert (r.json()["error"]["code"], r.json()["error"]["param"]) == ("model_not_found", "model_group")
    assert empty.status_code == 400
    assert (empty.json()["error"]["code"], empty.json()["error"]["param"]) == (
        "invalid_request",
        "model_group",
    )


def test_model_group_info_needs_a_key(gw: Gateway) -> None:
    r = httpx.get(gw.url + "/model_group/info", params={"model_group": "meta/llama-3.1-8b"})
    assert r.status_code == 401


def test_stream_usage_is_requested_upstream_only_when_supported(
    gw: Gateway, key: KeyHandle, sim: httpx.Client
) -> None:
    marker, r = send(gw, key, "openai/gpt-4o-mini", stream=True)
    assert r.status_code == 200
    (received,) = sim_requests(sim, marker)
    assert received["stream_options"] == {"include_usage": True}

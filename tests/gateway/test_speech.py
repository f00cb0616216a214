"""POST /v1/audio/speech with the official openai client: audio bytes streamed, priced per character."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import httpx
import openai
import pytest

from gateway.config import Prices
from gateway.pricing import Usage, cost
from harness import Gateway, KeyHandle, chat_model, eventually, gateway

MODEL = "openai/tts-1"
PRICES = Prices(input=Decimal("2.50"), output=Decimal(10), character=Decimal(15))


@pytest.fixture
def oai(gw: Gateway, key: KeyHandle) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gw.openai_base, api_key=key.key, max_retries=0) as c:
        yield c


def test_wav_streamed_with_cost_and_usage_record(gw: Gateway, key: KeyHandle, oai: openai.OpenAI) -> None:
    text = "Hello from the gateway."
    before = gw.balance(key.account_id)
    with oai.audio.speech.with_streaming_response.create(
        model=MODEL, voice="alloy", input=text, response_format="wav"
    ) as response:
        assert response.headers["content-type"] == "audio/wav"
        audio = b"".join(response.iter_bytes())
        charged = Decimal(response.headers["x-service-cost"])
        usage_id = response.headers["x-service-response-id"]
    assert audio[:4] == b"RIFF" and audio[8:12] == b"WAVE"
    assert len(audio) == 44 + int(len(text) * 0.02 * 24_000) * 2
    assert charged > 0
    assert gw.wait_balance(key.account_id, before - charged) == before - charged
    with gw.client(key.key) as c:
        deadline = time.monotonic() + 5
        while (r := c.get(f"/v1/usage/{usage_id}")).status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert r.status_code == 200 and Decimal(str(r.json()["cost"])) == charged
    tokens = r.json()["usage"]["prompt_tokens"]
    assert charged == cost(PRICES, Usage(prompt_tokens=tokens, characters=len(text)))


def test_client_default_format_is_mp3(oai: openai.OpenAI) -> None:
    audio = oai.audio.speech.create(model=MODEL, voice="alloy", input="Hi").content
    assert audio[:2] == b"\xff\xfb"  # an MPEG audio frame


def test_unsupported_parameters_dropped(gw: Gateway, key: KeyHandle, sim: httpx.Client) -> None:
    marker = "marker " + os.urandom(4).hex()
    with gw.client(key.key) as c:
        r = c.post(
            "/v1/audio/speech",
            json={
                "model": MODEL,
                "voice": "alloy",
                "input": marker,
                "speed": 1.5,
                "temperature": 2,
                "response_format": "pcm",
            },
        )
    assert r.status_code == 200
    (received,) = [e["body"] for e in sim.get("/_sim/requests").json() if e["body"].get("input") == marker]
    assert received == {
        "model": "tts-1",
        "voice": "alloy",
        "input": marker,
        "speed": 1.5,
        "response_format": "pcm",
    }


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": MODEL, "voice": "alloy"}, "input"),
        ({"model": MODEL, "voice": "alloy", "input": "x" * 4097}, "input"),
        ({"model": MODEL, "input": "hi"}, "voice"),
        ({"model": "openai/gpt-4o-mini", "voice": "alloy", "input": "hi"}, "model"),
    ],
)
def test_bad_requests(gw: Gateway, key: KeyHandle, body: dict[str, object], param: str) -> None:
    with gw.client(key.key) as c:
        r = c.post("/v1/audio/speech", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param


def test_upstream_failure_is_provider_error_and_not_charged(gw: Gateway, key: KeyHandle) -> None:
    before = gw.balance(key.account_id)
    with gw.client(key.key) as c:
        r = c.post("/v1/audio/speech", json={"model": MODEL, "voice": "alloy", "input": "[sim fail=500]"})
    assert r.status_code == 502 and r.json()["error"]["code"] == "provider_error"
    time.sleep(0.2)  # a charge, if there were one, would have landed by now
    assert gw.balance(key.account_id) == before


def test_an_upstream_that_breaks_off_an_idempotent_answer_is_provider_error(gw: Gateway) -> None:
    """Review: with an Idempotency-Key the audio is kept whole before it is answered, and an
    upstream that broke off meanwhile was a 500. It is the model's failure: 502 provider_error,
    nothing charged, nothing kept (the key may be retried); without the key, the audio is sent as
    it comes and ends cut short (docs/behaviour.md)."""
    handle = gw.new_key(balance="1")
    body = {"model": MODEL, "voice": "alloy", "input": "a long speech " * 40 + "[sim drop_after=2]"}
    with gw.client(handle.key) as c:
        r = c.post("/v1/audio/speech", json=body, headers={"Idempotency-Key": "speech-broken"})
        assert r.status_code == 502 and r.json()["error"]["code"] == "provider_error", r.text
        again = c.post("/v1/audio/speech", json=body, headers={"Idempotency-Key": "speech-broken"})
        assert again.status_code == 502 and "idempotency-replayed" not in again.headers
    time.sleep(0.2)  # a charge, if there were one, would have landed by now
    assert gw.balance(handle.account_id) == Decimal("1")


def test_an_upstream_that_breaks_off_streamed_audio_is_logged_as_its_failure(gw: Gateway) -> None:
    """Without an Idempotency-Key the audio goes out as it comes and ends cut short; its log entry
    says the model failed (error code provider_error), not that the client left (review: 499)."""
    handle = gw.new_key(balance="1")
    body = {"model": MODEL, "voice": "alloy", "input": "a long speech " * 40 + "[sim drop_after=2]"}
    request_id = ""
    with (
        gw.client(handle.key) as c,
        contextlib.suppress(httpx.HTTPError),
        c.stream("POST", "/v1/audio/speech", json=body) as r,
    ):
        assert r.status_code == 200
        request_id = r.headers["x-service-request-id"]
        for _ in r.iter_bytes():
            pass

    def logged() -> list[tuple[object, ...]]:
        return gw.query("SELECT status, error_code FROM request_logs WHERE id = ?", request_id)

    eventually(logged, 10, 0.05, what="the request logged")
    assert logged() == [(200, "provider_error")]
    assert gw.balance(handle.account_id) == Decimal("1")


def test_the_synchronous_window_bounds_the_wait_for_the_audio(tmp_path: Path, sim_url: str) -> None:
    """Spec 8: an upstream that has not begun its audio when the window closes (from the request's
    start) is 504 timeout, not charged, with an Idempotency-Key or without (operator review: speech
    waited on); audio that has begun flows as a stream does. The stream idle window (here shorter)
    bounds the silences between pieces of audio, not the wait for the answer (spec review: speech
    whose model took longer than it to begin got 408 timeout, a stream's answer, well inside the
    synchronous window)."""
    models = chat_model(MODEL, "tts-1", sim_url, type_="speech")
    limits = "sync_timeout_seconds = 2.5\nstream_idle_timeout_seconds = 0.8"
    with gateway(tmp_path, models, limits_toml=limits) as g:
        key = g.new_key(balance="5")
        with g.client(key.key) as c:
            for headers in ({}, {"Idempotency-Key": "slow-" + os.urandom(4).hex()}):
                started = time.monotonic()
                body = {"model": MODEL, "input": "late [sim ttft=4s]", "voice": "alloy"}
                r = c.post("/v1/audio/speech", json=body, headers=headers)
                assert r.status_code == 504 and r.json()["error"]["code"] == "timeout", r.text
                assert r.headers["connection"] == "close"  # spec 8: then the connection closed
                assert 2.4 < time.monotonic() - started < 4
            slow_start = {"model": MODEL, "input": "slow start [sim ttft=1.2s]", "voice": "alloy"}
            r = c.post("/v1/audio/speech", json=slow_start)
            assert r.status_code == 200 and r.content, r.text
            flowing = {"model": MODEL, "input": "on time [sim pace=300ms] " + "word " * 60, "voice": "alloy"}
            r = c.post("/v1/audio/speech", json=flowing)
            assert r.status_code == 200 and len(r.content) > 1000  # past the window, while it flows
            stalled = {
                "model": MODEL,
                "input": "stalls [sim stall_after=2] " + "word " * 40,
                "voice": "alloy",
            }
            with pytest.raises(httpx.RemoteProtocolError):  # cut short by the idle window once begun
                c.post("/v1/audio/speech", json=stalled)

        def statuses() -> list[int] | None:
            rows = g.query(
                "SELECT status FROM request_logs WHERE path = ? ORDER BY started_at_ms", "/v1/audio/speech"
            )
            return [row[0] for row in rows] if len(rows) == 5 else None

        assert eventually(statuses, what="the five entries") == [504, 504, 200, 200, 200]
        cut = g.query(
            "SELECT error_code FROM request_logs WHERE path = ? ORDER BY started_at_ms", "/v1/audio/speech"
        )
        assert cut[-1] == ("timeout",), cut

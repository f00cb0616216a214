"""Issue 16 through real processes: GET /health and /ready, GET /metrics summed over workers, and the
structured request lines on stderr."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path

import httpx
import openai
import orjson
import pytest

from gateway.config import load_settings
from harness import chat_model, eventually, free_port, new_key, running

METRICS_TOKEN = "metrics-" + "m" * 32
ADMIN_TOKEN = "admin-" + "a" * 32


@contextmanager
def serving(tmp: Path, sim_url: str, extra: str = "", workers: int = 1) -> Iterator[tuple[str, Path, Path]]:
    """`gateway serve` on a new SQLite store: (base URL, its config, the file its output goes to)."""
    port = free_port()
    config = tmp / "gateway.toml"
    config.write_text(
        f"[server]\nport = {port}\nworkers = {workers}\ndrain_notice_seconds = 0\n"
        f'[store]\npath = "{tmp / "gw.db"}"\n'
        f'[admin]\ntoken_env = "T_ADMIN"\n{extra}\n' + chat_model("test/chat", "sim-chat", sim_url)
    )
    out = tmp / "gateway.log"
    env = {"T_ADMIN": ADMIN_TOKEN, "T_METRICS": METRICS_TOKEN}
    with running(["serve", "--config", str(config)], port, env, output=out):
        yield f"http://127.0.0.1:{port}", config, out


def _metric(text: str, name: str, **labels: str) -> float:
    """The sum of a metric's samples whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        sample, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in sample for k, v in labels.items()):
            total += float(value)
    return total


def test_health_and_ready_need_no_key_and_show_nothing_secret(tmp_path: Path, sim_url: str) -> None:
    with serving(tmp_path, sim_url) as (url, _, _):
        health = httpx.get(url + "/health")
        assert health.status_code == 200 and health.json() == {"status": "ok"}
        ready = httpx.get(url + "/ready")
        assert ready.status_code == 200 and ready.json() == {"status": "ready"}
        assert httpx.post(url + "/ready").status_code == 405


@pytest.mark.parametrize("over", ["tcp", "unix"])
def test_ready_says_503_and_why_when_redis_is_out_of_reach(tmp_path: Path, sim_url: str, over: str) -> None:
    dead = free_port()  # nothing listens there
    where = f"127.0.0.1:{dead}/0" if over == "tcp" else f"{tmp_path}/redis-{dead}.sock"
    redis_url = f"redis://{where}" if over == "tcp" else f"unix://{where}"
    with serving(tmp_path, sim_url, f'[redis]\nurl = "{redis_url}"\n') as (url, _, _):
        ready = httpx.get(url + "/ready")
        assert ready.status_code == 503
        assert ready.headers["retry-after"]
        body = ready.json()
        assert body["status"] == "unavailable"
        assert any("Redis is out of reach" in r for r in body["reasons"])
        # Operator review: the unauthenticated probe named Redis's address (its socket's path too).
        assert str(dead) not in ready.text and "127.0.0.1" not in ready.text, ready.text
        assert httpx.get(url + "/health").status_code == 200  # the process itself answers


def test_metrics_need_their_token_and_are_off_without_one(tmp_path: Path, sim_url: str) -> None:
    with serving(tmp_path, sim_url, '[metrics]\ntoken_env = "T_METRICS"\n') as (url, _, _):
        assert httpx.get(url + "/metrics").status_code == 401
        wrong = httpx.get(url + "/metrics", headers={"authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_admin_token"
        for token in (METRICS_TOKEN, ADMIN_TOKEN):
            ok = httpx.get(url + "/metrics", headers={"authorization": f"Bearer {token}"})
            assert ok.status_code == 200 and ok.headers["content-type"].startswith("text/plain")
    with serving(tmp_path, sim_url, '[metrics]\nenabled = false\ntoken_env = "T_METRICS"\n') as (url, _, _):
        off = httpx.get(url + "/metrics", headers={"authorization": f"Bearer {METRICS_TOKEN}"})
        assert off.status_code == 404 and off.json()["error"]["code"] == "not_found"


def test_metrics_count_every_request_over_every_worker(tmp_path: Path, sim_url: str) -> None:
    extra = '[metrics]\ntoken_env = "T_METRICS"\n'
    with serving(tmp_path, sim_url, extra, workers=2) as (url, config, _):
        key = new_key(load_settings(config), Decimal("10"))
        client = openai.OpenAI(base_url=url + "/v1", api_key=key.key, max_retries=0)
        plain = 12
        for _ in range(plain):
            client.chat.completions.create(model="test/chat", messages=[{"role": "user", "content": "hi"}])
        stream = client.chat.completions.create(
            model="test/chat", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        with pytest.raises(openai.BadRequestError):  # an unknown model's name is not a label
            client.chat.completions.create(
                model="made/up-" + "x" * 20, messages=[{"role": "user", "content": "x"}]
            )
        httpx.get(url + "/v1/models", headers={"authorization": "Bearer sk-wrong"})
        # Each worker adds its requests to the shared values once a second: until every one has.
        deadline = time.monotonic() + 10
        while True:
            text = httpx.get(url + "/metrics", headers={"authorization": f"Bearer {METRICS_TOKEN}"}).text
            listed = _metric(text, "gateway_requests_total", endpoint="/v1/models")
            tried = _metric(text, "gateway_upstream_attempts_total")
            if (listed >= 1 and tried >= plain + 1) or time.monotonic() > deadline:
                break
            time.sleep(0.2)

    endpoint = "/v1/chat/completions"
    ok = _metric(text, "gateway_requests_total", endpoint=endpoint, model="test/chat", status="200")
    assert ok == plain + 1
    assert "made/up" not in text
    assert (
        _metric(text, "gateway_requests_total", endpoint="/v1/models", status="401", code="invalid_api_key")
        == 1
    )
    assert _metric(text, "gateway_added_latency_seconds_count", endpoint=endpoint) == plain + 1
    assert _metric(text, "gateway_upstream_latency_seconds_count", endpoint=endpoint) == plain + 1
    assert _metric(text, "gateway_stream_first_byte_seconds_count", endpoint=endpoint) == 1
    assert _metric(text, "gateway_tokens_total", model="test/chat", direction="in") > 0
    assert _metric(text, "gateway_tokens_total", model="test/chat", direction="out") > 0
    assert _metric(text, "gateway_cost_usd_total", model="test/chat") > 0
    assert _metric(text, "gateway_upstream_attempts_total", model="test/chat", outcome="ok") == plain + 1
    for name in ("gateway_holds_outstanding", "gateway_money_held_usd", "gateway_channel_state"):
        assert re.search(rf"^{name}\b", text, re.M), name


def test_one_json_line_per_request_with_its_ids_and_no_secret(tmp_path: Path, sim_url: str) -> None:
    with serving(tmp_path, sim_url) as (url, config, out):
        key = new_key(load_settings(config), Decimal("10"))
        traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        answer = httpx.post(
            url + "/v1/chat/completions",
            json={"model": "test/chat", "messages": [{"role": "user", "content": "hi"}]},
            headers={"authorization": f"Bearer {key.key}", "traceparent": traceparent},
        )
        assert answer.status_code == 200
        request_id = answer.headers["x-service-request-id"]
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and request_id not in out.read_text():
            time.sleep(0.05)
        text = out.read_text()
    lines = [orjson.loads(line) for line in text.splitlines() if line.startswith("{")]
    mine = [line for line in lines if line.get("request_id") == request_id]
    assert len(mine) == 1, text[-3000:]
    line = mine[0]
    assert line["logger"] == "gateway.access" and line["level"] == "info"
    assert line["trace_id"] == "0af7651916cd43dd8448eb211c80319c"
    assert line["account_id"] == key.account_id and line["key_id"] == key.key_id
    assert line["model"] == "test/chat" and line["status"] == 200 and line["code"] is None
    assert line["endpoint"] == "/v1/chat/completions"
    assert line["prompt_tokens"] > 0 and line["completion_tokens"] > 0 and line["cost"]
    assert 0 < line["added_ms"] < line["duration_ms"] and line["upstream_ms"] > 0
    assert key.key not in text and ADMIN_TOKEN not in text


def test_a_speech_stream_reports_its_upstream_time_and_first_byte(tmp_path: Path, sim_url: str) -> None:
    speech = chat_model("test/tts", "tts-1", sim_url, type_="speech")
    with serving(tmp_path, sim_url, speech) as (url, config, out):
        key = new_key(load_settings(config), Decimal("10"))
        answer = httpx.post(
            url + "/v1/audio/speech",
            json={"model": "test/tts", "input": "Say this.", "voice": "alloy"},
            headers={"authorization": f"Bearer {key.key}"},
        )
        assert answer.status_code == 200 and answer.content
        request_id = answer.headers["x-service-request-id"]
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and request_id not in out.read_text():
            time.sleep(0.05)
        lines = [orjson.loads(x) for x in out.read_text().splitlines() if x.startswith("{")]
    line = next(x for x in lines if x.get("request_id") == request_id)
    assert line["endpoint"] == "/v1/audio/speech" and line["status"] == 200
    assert line["upstream_ms"] > 0 and line["first_byte_ms"] >= line["upstream_ms"]
    assert line["added_ms"] is not None and line["added_ms"] >= 0


def test_a_library_s_warning_is_a_json_line_too(tmp_path: Path, sim_url: str) -> None:
    """The libraries' own records go out in the gateway's format: python-multipart's word on a
    malformed form was a bare line in the JSON stream (fuzz review)."""
    with serving(tmp_path, sim_url) as (url, _, out):
        answer = httpx.post(
            url + "/console/login",
            content=b"x=1",
            headers={"content-type": "multipart/form-data; boundary=zz"},
        )
        assert answer.status_code == 400
        eventually(lambda: "boundary" in out.read_text(), what="python-multipart's warning in the log")
        text = out.read_text()
    lines = text.splitlines()
    assert all(line.startswith("{") for line in lines), [line for line in lines if not line.startswith("{")]
    (warning,) = [orjson.loads(line) for line in lines if "boundary" in line]
    assert warning["level"] == "warning" and warning["logger"].startswith("python_multipart")

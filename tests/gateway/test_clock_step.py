"""The machine's wall clock stepped back while a request runs (an NTP correction): the request's
usage record and log entry keep its real duration, its end after its start (time review: a step
back of 10 s logged -7,997 ms and an end before the start). The request's instants are read on the
monotonic clock, its records' wall times made from them (gateway.clock)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import httpx

from harness import chat_model, gateway

HERE = Path(__file__).resolve().parent
MODEL = "openai/gpt-4o-mini"


def test_a_clock_stepped_back_mid_request_keeps_its_duration(tmp_path: Path, sim_url: str) -> None:
    offset = tmp_path / "clock-offset"
    offset.write_text("0")
    env = {
        "GATEWAY_TEST_CLOCK_FILE": str(offset),
        "PYTHONPATH": os.pathsep.join([str(HERE.parent / "clock_step"), os.environ.get("PYTHONPATH", "")]),
    }
    with gateway(tmp_path, chat_model(MODEL, "gpt-4o-mini", sim_url), env=env) as gw:
        handle = gw.new_key()
        # The simulator waits 1.5 s before it answers; 0.5 s into the request the clock steps back.
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi [sim ttft=1500ms]"}]}
        stepper = threading.Timer(0.5, lambda: offset.write_text(str(-10 * 10**9)))
        stepper.start()
        try:
            begun = time.monotonic()
            answer = httpx.post(
                f"{gw.url}/v1/chat/completions",
                json=body,
                headers={"authorization": f"Bearer {handle.key}"},
                timeout=30,
            )
            took_ms = (time.monotonic() - begun) * 1000
        finally:
            stepper.join()
        assert answer.status_code == 200, answer.text
        record = gw.usage_record(handle.key, answer.json()["id"])
        assert 1_400 <= record["duration_ms"] <= took_ms + 50, (record, took_ms)
        assert record["ended_at"] > record["started_at"], record
        ((duration,),) = gw.query(
            "SELECT duration_ms FROM request_logs WHERE id = ?", answer.headers["x-service-request-id"]
        )
        assert 1_400 <= duration <= took_ms + 50, (duration, took_ms)

"""An Idempotency-Key's answer, once the client has it, is replayed by every worker: through
`gateway serve` with two workers on the embedded store, where each worker finds a key's claim in the
database, not in the other's memory."""

from __future__ import annotations

import http.client
import json
import uuid
from collections import Counter
from decimal import Decimal
from pathlib import Path

import pytest

from gateway.config import load_settings
from harness import chat_model, free_port, new_key, running

pytestmark = pytest.mark.slow


def _post(port: int, key: str, idempotency_key: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
    """One request on a connection of its own (the next one may reach the other worker)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(
            "POST",
            "/v1/images/generations",
            body,
            {
                "authorization": f"Bearer {key}",
                "content-type": "application/json",
                "idempotency-key": idempotency_key,
                "connection": "close",
            },
        )
        answer = conn.getresponse()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
    finally:
        conn.close()


def test_a_retry_right_after_the_answer_is_replayed_on_any_worker(tmp_path: Path, sim_url: str) -> None:
    """Review: the charge and the kept answer were durable (journaled) before the answer went out,
    but the other worker read the key's claim from the database before the writer's next group
    commit, and a retry sent the moment the answer arrived got 409 idempotency_key_in_progress in
    about half of 30 tries."""
    port = free_port()
    config = tmp_path / "gateway.toml"
    config.write_text(
        f'[server]\nport = {port}\nworkers = 2\n[store]\npath = "{tmp_path / "gw.db"}"\n'
        + chat_model("openai/dall-e-3", "dall-e-3", sim_url, type_="image")
    )
    handle = new_key(load_settings(config), Decimal(10))
    outcomes: Counter[str] = Counter()
    with running(["serve", "--config", str(config)], port):
        for n in range(30):
            body = json.dumps(
                {"model": "openai/dall-e-3", "prompt": f"a cat {n}", "size": "1024x1024"}
            ).encode()
            token = uuid.uuid4().hex
            status, _, first = _post(port, handle.key, token, body)
            assert status == 200, first
            status, headers, again = _post(port, handle.key, token, body)
            outcomes[f"{status} {headers.get('idempotency-replayed')}"] += 1
            if status == 200:
                assert json.loads(again)["data"] == json.loads(first)["data"]
    assert outcomes == {"200 true": 30}, outcomes

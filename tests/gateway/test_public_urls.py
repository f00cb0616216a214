"""The URLs the gateway hands out (images, videos) never take a client's Host header: they come from
`[server] public_base_url`, from a Host in `[server] allowed_hosts`, or from the address the gateway
listens on (as `gateway serve --port` sets it)."""

from __future__ import annotations

import os
import sqlite3
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.config import ConfigError, load_settings, parse_settings
from harness import Gateway, chat_model, eventually, free_port, running

ATTACKER = "attacker.invalid"
ALLOWED = "images.example.test"
IMAGE_MODEL = "openai/gpt-image-1"
FILES = "/v1/images/files/"


@pytest.fixture(scope="module")
def ugw(sim_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A gateway started with `serve --port P` while its file names another port, with one allowed
    host; an image model and a video model answered by the simulator."""
    tmp = tmp_path_factory.mktemp("urls")
    port, file_port = free_port(), free_port()
    models = chat_model(IMAGE_MODEL, "gpt-image-1", sim_url, type_="image") + chat_model(
        "openai/sora-2", "sora-2+render=200ms", sim_url, type_="video"
    )
    config = tmp / "gateway.toml"
    config.write_text(
        f'[server]\nport = {file_port}\nallowed_hosts = ["{ALLOWED}"]\n'
        f'[store]\npath = "{tmp / "gateway.db"}"\n[videos]\npoll_seconds = 0.1\n{models}'
    )
    with running(["serve", "--config", str(config), "--port", str(port)], port) as proc:
        yield Gateway(f"http://127.0.0.1:{port}", proc, load_settings(config), config)


def generate(
    gw: Gateway, key: str, host: str, idempotency_key: str | None = None, prompt: str = "a lighthouse"
) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}", "host": host}
    if idempotency_key is not None:
        headers["idempotency-key"] = idempotency_key
    body = {"model": IMAGE_MODEL, "prompt": prompt}
    return httpx.post(gw.url + "/v1/images/generations", json=body, headers=headers, timeout=30)


def logged_body(db: Path, request_id: str) -> bytes:
    def row() -> tuple[Any, ...] | None:
        with sqlite3.connect(db) as conn:
            found: tuple[Any, ...] | None = conn.execute(
                "SELECT response_body FROM request_logs WHERE id = ?", (request_id,)
            ).fetchone()
        return found

    return bytes(eventually(row, what=f"the request log entry {request_id}")[0])


def test_a_forged_host_gets_the_listen_address(ugw: Gateway) -> None:
    key = ugw.new_key()
    prompt = "a lighthouse " + os.urandom(4).hex()
    first = generate(ugw, key.key, ATTACKER, "forged-host", prompt)
    assert first.status_code == 200, first.text
    url = first.json()["data"][0]["url"]
    assert url.startswith(ugw.url + FILES), url  # the --port given, not the file's nor the Host's
    assert httpx.get(url, timeout=10).status_code == 200
    # What was kept for the idempotent replay and for the log has no trace of the forged host.
    replay = generate(ugw, key.key, ATTACKER, "forged-host", prompt)
    assert replay.headers.get("idempotency-replayed") == "true" and ATTACKER not in replay.text
    assert ATTACKER.encode() not in logged_body(ugw.db_path, first.headers["x-service-request-id"])


def test_an_allowed_host_is_used_as_the_client_sent_it(ugw: Gateway) -> None:
    key = ugw.new_key()
    port = ugw.url.rsplit(":", 1)[1]
    for host in (f"{ALLOWED}:{port}", ALLOWED.upper()):
        r = generate(ugw, key.key, host)
        assert r.status_code == 200, r.text
        assert r.json()["data"][0]["url"].startswith(f"http://{host.lower()}{FILES}")


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_video_download_url_ignores_a_forged_host(ugw: Gateway) -> None:
    key = ugw.new_key()
    headers = {"authorization": f"Bearer {key.key}", "host": ATTACKER}
    with httpx.Client(base_url=ugw.url, headers=headers, timeout=30) as c:
        created = c.post("/v1/videos", json={"model": "openai/sora-2", "prompt": "a kite", "seconds": "1"})
        assert created.status_code == 200, created.text
        video_id = created.json()["id"]
        deadline = time.monotonic() + 10
        while (job := c.get(f"/v1/videos/{video_id}").json())["status"] != "completed":
            assert time.monotonic() < deadline and job["status"] != "failed", (job["status"], job)
            time.sleep(0.05)
    assert job["download_url"] == f"{ugw.url}/v1/videos/{video_id}/content"


@pytest.mark.parametrize("value", ['"gateway.example.com"', '[""]', '["https://x.test/"]', "[1]"])
def test_allowed_hosts_must_be_a_list_of_host_names(value: str, tmp_path: Path) -> None:
    raw = tomllib.loads(f"[server]\nallowed_hosts = {value}\n" + chat_model("a/b", "b", "http://x"))
    with pytest.raises(ConfigError, match="allowed_hosts"):
        parse_settings(raw, tmp_path)

"""Spec 1.4.1, every successful response includes usage: also when the upstream reports none
(OpenAI-compatible servers often leave it out of embeddings and transcriptions), the answer carries
OpenAI's usage object with what the gateway counted and billed. The upstream here is a bare HTTP
server that answers without usage; the clients are the official openai ones."""

from __future__ import annotations

import io
import wave
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import httpx
import openai
import pytest

from harness import Gateway, bare_upstream, chat_model, eventually, gateway, send_json


class _NoUsage(BaseHTTPRequestHandler):
    """Embeddings and transcriptions as OpenAI answers them, minus `usage`."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        answer: dict[str, Any]
        if self.path.endswith("/embeddings"):
            answer = {
                "object": "list",
                "model": "e",
                "data": [{"object": "embedding", "index": 0, "embedding": [0.5]}],
            }
        else:
            answer = {"text": "hello there general kenobi"}
        send_json(self, 200, answer)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with bare_upstream(_NoUsage) as url:
        models = chat_model("bare/embed", "e", url, type_="embedding") + chat_model(
            "bare/whisper", "w", url, type_="transcription"
        )
        with gateway(tmp_path_factory.mktemp("bare"), models) as g:
            yield g


def usage_record(gw: Gateway, key: str, rid: str) -> dict[str, Any]:
    with gw.client(key) as c:

        def answered() -> httpx.Response | None:
            r = c.get(f"/v1/usage/{rid}")
            return None if r.status_code == 404 else r

        r = eventually(answered, what=f"the usage record {rid}")
    assert r.status_code == 200, r.text
    record: dict[str, Any] = r.json()
    return record


def wav(seconds: float) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(b"\0\0" * int(8000 * seconds))
    return out.getvalue()


def test_embeddings_without_upstream_usage(bare: Gateway) -> None:
    key = bare.new_key()
    with openai.OpenAI(base_url=bare.openai_base, api_key=key.key, max_retries=0) as oai:
        raw = oai.embeddings.with_raw_response.create(model="bare/embed", input="count these words")
    body = raw.http_response.json()
    tokens = usage_record(bare, key.key, body["id"])["usage"]["prompt_tokens"]
    assert tokens > 0 and body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    assert raw.parse().usage.prompt_tokens == tokens


@pytest.mark.parametrize(("upload", "kind"), [(wav(2.5), "duration"), (b"ID3 not a wav", "tokens")])
def test_transcription_without_upstream_usage(bare: Gateway, upload: bytes, kind: str) -> None:
    key = bare.new_key()
    with openai.OpenAI(base_url=bare.openai_base, api_key=key.key, max_retries=0) as oai:
        raw = oai.audio.transcriptions.with_raw_response.create(
            model="bare/whisper", file=("a.wav", upload), response_format="json"
        )
    body = raw.http_response.json()
    record = usage_record(bare, key.key, raw.headers["x-service-response-id"])
    if kind == "duration":
        assert body["usage"] == {"type": "duration", "seconds": 3}
    else:
        tokens = record["usage"]["completion_tokens"]
        assert tokens > 0
        assert body["usage"] == {
            "type": "tokens",
            "input_tokens": 0,
            "output_tokens": tokens,
            "total_tokens": tokens,
        }

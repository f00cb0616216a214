from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from harness import Gateway, KeyHandle, chat_model, free_port, gateway, running


@pytest.fixture(scope="session")
def sim_url() -> Iterator[str]:
    port = free_port()
    with running(["sim", "--port", str(port)], port):
        yield f"http://127.0.0.1:{port}"


@pytest.fixture(scope="session")
def gw(sim_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """One gateway for the session, with two chat model families that accept different parameters."""
    models = chat_model("openai/gpt-4o-mini", "gpt-4o-mini", sim_url) + chat_model(
        "meta/llama-3.1-8b",
        "llama-3.1-8b",
        sim_url,
        extra='tokenizer = "cl100k_base"\n'
        'supported_params = ["max_tokens", "stream", "stream_options", "temperature", "top_k", "top_p"]',
    )
    models += chat_model(
        "openai/text-embedding-3-small", "text-embedding-3-small", sim_url, type_="embedding"
    )
    models += chat_model(
        "anthropic/claude-sonnet-4-5", "claude-sonnet-4-5", sim_url, type_="messages", provider="anthropic"
    )
    models += chat_model("cohere/rerank-v3.5", "rerank-v3.5", sim_url, type_="rerank", provider="cohere")
    models += chat_model("openai/tts-1", "tts-1", sim_url, type_="speech")
    models += chat_model("openai/gpt-4.1-mini", "gpt-4.1-mini", sim_url, type_="responses")
    models += chat_model("openai/whisper-1", "whisper-1", sim_url, type_="transcription")
    models += chat_model("openai/gpt-image-1", "gpt-image-1", sim_url, type_="image")
    models += chat_model("openai/dall-e-3", "dall-e-3", sim_url, type_="image")
    models += chat_model("openai/gpt-4o-transcribe", "gpt-4o-transcribe", sim_url, type_="transcription")
    with gateway(tmp_path_factory.mktemp("gw"), models) as g:
        yield g


@pytest.fixture
def key(gw: Gateway) -> KeyHandle:
    """A fresh account with $100 and one key, so tests never share a balance."""
    return gw.new_key()


@pytest.fixture
def sim(sim_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=sim_url, timeout=10) as client:
        yield client

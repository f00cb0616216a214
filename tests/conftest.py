from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from urllib.parse import urlsplit

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


# The services of the scaled-out set-up (issue 14), as they run here and in CI.
REDIS_URL = os.environ.get("GATEWAY_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
REQUIRE_SERVICES = os.environ.get("GATEWAY_REQUIRE_SERVICES") == "1"


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The test Redis. Tests that need it are skipped when it does not answer, unless
    GATEWAY_REQUIRE_SERVICES=1 (CI), which makes that a failure. Tests share it: each uses keys of
    its own (a unique prefix, or unique model names)."""
    parts = urlsplit(REDIS_URL)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 6379), timeout=2) as s:
            s.sendall(b"PING\r\n")
            answered = s.recv(64).startswith(b"+PONG")
    except OSError:
        answered = False
    if not answered:
        reason = f"Redis at {REDIS_URL} does not answer PING"
        if REQUIRE_SERVICES:
            pytest.fail(reason + " (GATEWAY_REQUIRE_SERVICES=1)")
        pytest.skip(reason)
    return REDIS_URL


POSTGRES_URL = os.environ.get("GATEWAY_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A database of its own for the session (gateway_test_<random>, created through the test
    PostgreSQL's `test` database and dropped at the end). Tests that need it are skipped when
    PostgreSQL does not answer, unless GATEWAY_REQUIRE_SERVICES=1 (CI), which makes that a failure."""
    import asyncio

    import asyncpg

    name = "gateway_test_" + os.urandom(6).hex()

    async def admin(sql: str) -> None:
        conn = await asyncpg.connect(POSTGRES_URL, timeout=5)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    try:
        asyncio.run(admin(f"CREATE DATABASE {name}"))
    except (OSError, asyncio.TimeoutError, asyncpg.PostgresError) as exc:
        reason = f"PostgreSQL at {POSTGRES_URL} is unusable: {exc}"
        if REQUIRE_SERVICES:
            pytest.fail(reason + " (GATEWAY_REQUIRE_SERVICES=1)")
        pytest.skip(reason)
    parts = urlsplit(POSTGRES_URL)
    yield parts._replace(path="/" + name).geturl()
    asyncio.run(admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))

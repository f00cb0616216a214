from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Generator, Iterator
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any, NoReturn
from urllib.parse import urlsplit

import httpx
import pytest

from harness import (
    BACKENDS,
    POSTGRES_URL,
    REDIS_URL,
    Gateway,
    KeyHandle,
    chat_model,
    free_port,
    gateway,
    postgres_database,
    running,
)

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page


@pytest.fixture(scope="session")
def sim_url() -> Iterator[str]:
    port = free_port()
    with running(["sim", "--port", str(port)], port):
        yield f"http://127.0.0.1:{port}"


def session_models(sim_url: str) -> str:
    """The session gateway's models: two chat model families that accept different parameters, and
    one model of every other type."""
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
    return models


@pytest.fixture(scope="session")
def sqlite_gw(sim_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """One gateway for the session on SQLite, with session_models."""
    with gateway(tmp_path_factory.mktemp("gw"), session_models(sim_url)) as g:
        yield g


@pytest.fixture(scope="session")
def gw(sqlite_gw: Gateway) -> Gateway:
    """The session gateway (a suite that runs on both backends overrides this: see backend_gw)."""
    return sqlite_gw


@pytest.fixture
def key(gw: Gateway) -> KeyHandle:
    """A fresh account with $100 and one key, so tests never share a balance."""
    return gw.new_key()


@pytest.fixture
def sim(sim_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=sim_url, timeout=10) as client:
        yield client


# The services of the scaled-out set-up (issue 14), as they run here and in CI (addresses in harness.py).
REQUIRE_SERVICES = os.environ.get("GATEWAY_REQUIRE_SERVICES") == "1"


def unavailable(reason: str) -> NoReturn:
    """A service a test needs is missing: the test is skipped, or fails under
    GATEWAY_REQUIRE_SERVICES=1 (set by .ci/run), where a missing service must not pass unnoticed."""
    if REQUIRE_SERVICES:
        pytest.fail(reason + " (GATEWAY_REQUIRE_SERVICES=1)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The test Redis (skipped or failed by `unavailable` when it does not answer PING). Tests share
    it: each uses keys of its own (a unique prefix, or unique model names)."""
    parts = urlsplit(REDIS_URL)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 6379), timeout=2) as s:
            s.sendall(b"PING\r\n")
            answered = s.recv(64).startswith(b"+PONG")
    except OSError:
        answered = False
    if not answered:
        unavailable(f"Redis at {REDIS_URL} does not answer PING")
    return REDIS_URL


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A database of its own for the session (harness.postgres_database: made through the test
    PostgreSQL's `test` database, dropped at the end); skipped or failed by `unavailable` when
    PostgreSQL cannot be used."""
    try:
        import asyncpg
    except ImportError:
        unavailable("asyncpg is not installed")
    with ExitStack() as stack:
        try:
            url = stack.enter_context(postgres_database())
        except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
            unavailable(f"PostgreSQL at {POSTGRES_URL} is unusable: {exc}")
        yield url


@pytest.fixture(scope="session", params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The store backend a suite runs on: "sqlite", or "postgres" with Redis (skipped or failed by
    `unavailable` without them). Suites that run on both take this, or `backend_gw`."""
    if request.param == "postgres":
        request.getfixturevalue("postgres_url")
        request.getfixturevalue("redis_url")
    return str(request.param)


@pytest.fixture(scope="session")
def postgres_gw(
    postgres_url: str, redis_url: str, sim_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    """The session gateway's twin on PostgreSQL and Redis (a database and a Redis prefix of its own)."""
    with gateway(tmp_path_factory.mktemp("gw-postgres"), session_models(sim_url), backend="postgres") as g:
        yield g


@pytest.fixture(scope="session")
def backend_gw(backend: str, request: pytest.FixtureRequest) -> Gateway:
    """The session gateway on `backend`: sqlite_gw or postgres_gw. A suite that runs on both
    backends overrides `gw` with it:

        @pytest.fixture
        def gw(backend_gw: Gateway) -> Gateway:
            return backend_gw
    """
    chosen: Gateway = request.getfixturevalue(f"{backend}_gw")
    return chosen


# The browser of the console's tests: Debian's chromium (`make test-py` installs it, the Makefile's
# $(STAMPS)/chromium; Playwright's own browser download cannot be used here).
CHROMIUM = "/usr/bin/chromium"


class _PlaywrightLoop:
    """Playwright's sync API marks its event loop as running in the tests' thread from its start to
    its stop (its calls need that), and asyncio.run refuses to start while a loop is marked so:
    with the session's `browser` open, every later test calling asyncio.run (many do, and
    harness.with_store) would fail. So the mark is held only while Playwright is used: during the
    set-up and teardown of `browser` and of every fixture built on it (`page`, and any fixture
    depending on them), and during the call of a test that uses them; it is parked elsewhere.
    Inside those, asyncio code runs on a thread of its own (as harness._run does)."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None  # Playwright's, while a browser is open
        self.fixtures = {"browser"}  # the fixtures built on the browser, as they are set up

    def hold(self) -> None:
        if self.loop is not None and not self.loop.is_closed():
            asyncio.events._set_running_loop(self.loop)

    def park(self) -> None:
        if self.loop is not None and asyncio.events._get_running_loop() is self.loop:
            asyncio.events._set_running_loop(None)


_PLAYWRIGHT_LOOP = _PlaywrightLoop()


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(
    fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
) -> Generator[None, Any, Any]:
    if fixturedef.argname not in _PLAYWRIGHT_LOOP.fixtures:
        if not _PLAYWRIGHT_LOOP.fixtures.intersection(fixturedef.argnames):
            return (yield)
        _PLAYWRIGHT_LOOP.fixtures.add(fixturedef.argname)
    # Finalizers run last-in first-out: the loop is held for the fixture's own teardown only.
    request.addfinalizer(_PLAYWRIGHT_LOOP.park)
    _PLAYWRIGHT_LOOP.hold()
    try:
        return (yield)
    finally:
        request.addfinalizer(_PLAYWRIGHT_LOOP.hold)
        _PLAYWRIGHT_LOOP.park()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    if not _PLAYWRIGHT_LOOP.fixtures.intersection(getattr(item, "fixturenames", ())):
        return (yield)
    _PLAYWRIGHT_LOOP.hold()
    try:
        return (yield)
    finally:
        _PLAYWRIGHT_LOOP.park()


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    """Headless chromium driven by Playwright's sync API, one for the session (each test takes a
    context of its own: see `page`). Skipped or failed by `unavailable` without Playwright or
    chromium. Between its uses asyncio.run works as before (_PlaywrightLoop)."""
    try:
        from playwright.sync_api import Error, sync_playwright
    except ImportError:
        unavailable("playwright is not installed (the `test` extra of pyproject.toml)")
    if not os.access(CHROMIUM, os.X_OK):
        unavailable(f"{CHROMIUM} is missing (`make .stamps/chromium` installs Debian's chromium)")
    try:
        with sync_playwright() as playwright:
            try:
                # No sandbox: it cannot start as root (this machine and CI); the pages are our own.
                chromium = playwright.chromium.launch(
                    executable_path=CHROMIUM, headless=True, chromium_sandbox=False, args=["--no-sandbox"]
                )
            except Error as exc:
                unavailable(f"{CHROMIUM} does not start under Playwright: {exc.message.splitlines()[0]}")
            _PLAYWRIGHT_LOOP.loop = asyncio.events._get_running_loop()
            try:
                yield chromium
            finally:
                chromium.close()
    finally:
        _PLAYWRIGHT_LOOP.loop = None


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A page in a fresh browser context (its own cookies and storage), 1280x800, closed after."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        yield context.new_page()
    finally:
        context.close()

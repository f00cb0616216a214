"""The model endpoints served ahead of Starlette's stack (gateway.model_dispatch): the same answers,
errors and scope as through Starlette, and everything else still through Starlette."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import time
import weakref
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from gateway.app import EXCEPTION_HANDLERS, answer_exception, create_app
from gateway.config import ChannelConfig, ModelConfig, Prices, Settings
from gateway.model_dispatch import ModelDispatch
from gateway.routes import chat
from harness import new_key, query

MODEL_PATHS = {
    "/v1/chat/completions",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/v1/messages",  # the anthropic client or LiteLLM on a base URL that ends in /v1
    "/v1/v1/messages/count_tokens",
    "/messages",  # the AI SDK's Anthropic provider on the gateway's root
    "/messages/count_tokens",
    "/v1/responses",
    "/v1/embeddings",
    "/v1/moderations",
    "/v1/rerank",
    "/v2/rerank",
    "/v1/v1/rerank",  # the cohere client on a base URL that ends in /v1
    "/v1/v2/rerank",
    "/v1/audio/speech",
    "/v1/audio/transcriptions",
    "/v1/images/generations",
    "/v1/images/edits",
    "/v1/videos",
}


def _settings(tmp_path: Path) -> Settings:
    # An upstream nobody listens on: these requests never get that far.
    return Settings(
        models=(ModelConfig("a/b", "chat", (ChannelConfig("openai", "http://127.0.0.1:9", "b"),)),),
        store_path=tmp_path / "g.db",
    )


def test_exactly_the_model_endpoints_are_dispatched_ahead(tmp_path: Path) -> None:
    app = create_app(_settings(tmp_path))

    async def nowhere(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("not dispatched here")

    dispatch = ModelDispatch(nowhere, app.routes, answer_exception)
    assert dispatch.paths == MODEL_PATHS


def test_an_unexpected_failure_in_a_model_endpoint_is_a_logged_500_with_its_request_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = _settings(tmp_path)
    key = new_key(settings, Decimal("1"))

    def explode(payload: dict[str, Any]) -> None:
        raise RuntimeError("secret internals")

    monkeypatch.setattr(chat, "_validate", explode)
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        r = client.post(
            "/v1/chat/completions",
            headers={"authorization": f"Bearer {key.key}"},
            json={"model": "a/b", "messages": [{"role": "user", "content": "hi"}]},
        )
    assert r.status_code == 500
    assert r.json()["error"]["code"] == "api_error"
    assert "secret" not in r.text
    request_id = r.headers["x-service-request-id"]
    assert query(settings, "SELECT status, error_code FROM request_logs WHERE id = ?", request_id) == [
        (500, "api_error")
    ]


def test_a_refused_model_request_gets_the_spec_error(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    key = new_key(settings, Decimal("1"))
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        no_key = client.post("/v1/chat/completions", json={"model": "a/b"})
        bad_json = client.post(
            "/v1/chat/completions", headers={"authorization": f"Bearer {key.key}"}, content=b"{nope"
        )
    assert no_key.status_code == 401 and no_key.json()["error"]["code"] == "invalid_api_key"
    assert "x-service-request-id" not in no_key.headers
    assert bad_json.status_code == 400 and bad_json.json()["error"]["code"] == "invalid_request"
    assert bad_json.headers["x-service-request-id"]


def test_what_is_not_a_model_post_still_goes_through_starlette(tmp_path: Path) -> None:
    with TestClient(create_app(_settings(tmp_path)), raise_server_exceptions=False) as client:
        wrong_method = client.get("/v1/chat/completions")
        unknown = client.post("/v1/chat/completion")
    assert wrong_method.status_code == 405
    assert wrong_method.json()["error"]["code"] == "method_not_allowed"
    assert "POST" in wrong_method.headers["allow"]
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/chat/completions/"),
        ("POST", "/v1/messages/"),
        ("GET", "/v1/models/"),
        ("GET", "/health/"),
    ],
)
def test_a_trailing_slash_is_unknown_not_a_redirect(tmp_path: Path, method: str, path: str) -> None:
    """Starlette would answer 307 to the path without its slash, on the Host header's origin,
    before the key is checked: a client must never be sent elsewhere by what another put in Host."""
    with TestClient(create_app(_settings(tmp_path)), raise_server_exceptions=False) as client:
        r = client.request(method, path, headers={"host": "evil.example"}, follow_redirects=False)
    assert r.status_code == 404 and "location" not in r.headers
    assert r.json()["error"]["code"] == "not_found"  # in the Anthropic shape under /v1/messages too


def test_the_one_exception_table_serves_both(tmp_path: Path) -> None:
    app = create_app(_settings(tmp_path))
    for cls, handler in EXCEPTION_HANDLERS.items():
        assert app.exception_handlers[cls] is handler


def _model_requests(tmp_path: Path, sim_url: str) -> tuple[Settings, list[tuple[str, dict[str, Any]]]]:
    """Settings with a chat and a messages model on the simulator, and one request of every kind
    the model endpoints answer: plain, streamed, translated, refused."""
    settings = Settings(
        models=(
            ModelConfig("a/chat", "chat", (ChannelConfig("openai", sim_url + "/v1", "gpt-4o-mini"),)),
            ModelConfig("a/claude", "messages", (ChannelConfig("anthropic", sim_url, "claude-sonnet-4-5"),)),
        ),
        store_path=tmp_path / "g.db",
    )
    chat = {"model": "a/chat", "messages": [{"role": "user", "content": "hi"}]}
    messages = {"model": "a/claude", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}
    return settings, [
        ("/v1/chat/completions", chat),
        ("/v1/chat/completions", {**chat, "stream": True}),
        ("/v1/messages", messages),
        ("/v1/messages", {**messages, "stream": True}),
        ("/v1/messages", {**messages, "model": "a/chat"}),  # translated
        ("/v1/chat/completions", {**chat, "model": "a/claude", "stream": True}),  # translated
        ("/v1/chat/completions", {"model": "a/chat"}),  # refused
    ]


def test_model_requests_leave_no_cyclic_garbage(tmp_path: Path, sim_url: str) -> None:
    """What a request makes is freed when it ends, not left to the garbage collector: a reference
    cycle per request (the upstream answer's `content = self` once) made the young collection run
    every few thousand requests, milliseconds each, on the event loop."""
    settings, requests = _model_requests(tmp_path, sim_url)
    key = new_key(settings, Decimal("1"))
    with TestClient(create_app(settings)) as client:
        headers = {"authorization": f"Bearer {key.key}"}

        def send_all() -> None:
            for path, body in requests:
                r = client.post(path, headers=headers, json=body)
                assert r.status_code in (200, 400), r.text

        send_all()  # warm: caches, pools, the tokenizer
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            send_all()
            gc.collect()
            ours = sorted(
                {type(o).__qualname__ for o in gc.garbage if type(o).__module__.startswith("gateway")}
            )
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
    assert ours == []


class _Receive:
    """The server's `receive`, as an object a weak reference can follow (Granian's is a method of
    the connection's protocol object)."""

    def __init__(self, receive: Any) -> None:
        self._receive = receive

    async def __call__(self) -> Any:
        return await self._receive()


def test_model_requests_let_go_of_the_server_s_receive_when_they_end(tmp_path: Path, sim_url: str) -> None:
    """Nothing outlives a request holding its `receive` (nor its `Request`, which holds it): on
    Granian that keeps the connection's protocol object alive. A watch kept 50 ms past its request
    held it and the request's Call, and cost 14 % of the requests per second at c = 64
    (benches/README.md, "2026-11-29, afternoon")."""
    settings, requests = _model_requests(tmp_path, sim_url)
    key = new_key(settings, Decimal("1"))
    app = create_app(settings)
    held: list[str] = []

    async def watched(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        ours = _Receive(receive)
        gone = weakref.ref(ours)
        await app(scope, ours, send)
        del ours
        for _ in range(3):  # a cancelled watcher task lets go at its next step
            await asyncio.sleep(0)
        if gone() is not None:
            held.append(scope["path"])

    with TestClient(watched) as client:
        headers = {"authorization": f"Bearer {key.key}"}
        for path, body in requests:
            r = client.post(path, headers=headers, json=body)
            assert r.status_code in (200, 400), r.text
    assert held == []


def test_a_charge_queued_for_the_store_says_its_cost(
    tmp_path: Path, sim_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain answer whose charge could not be made durable (a full disk under the journal) is a
    503 that names the usage id its record will have, and now the cost it is charged too, as the
    answer would have said (spec 4: x-service-cost); the record, once the disk has room, agrees."""
    settings, requests = _model_requests(tmp_path, sim_url)
    priced = dataclasses.replace(settings.models[0], prices=Prices(input=Decimal(3), output=Decimal(15)))
    settings = dataclasses.replace(settings, models=(priced,))
    key = new_key(settings, Decimal("1"))
    full = {"disk": True}

    class FullDisk:
        def __init__(self, file: Any) -> None:
            self.file = file

        def append(self, data: bytes) -> None:
            if full["disk"]:
                raise OSError(28, "No space left on device")
            self.file.append(data)

        def __getattr__(self, name: str) -> object:
            return getattr(self.file, name)

    with TestClient(create_app(settings)) as client:
        headers = {"authorization": f"Bearer {key.key}"}
        store = client.app.state.gateway.store  # type: ignore[attr-defined]
        monkeypatch.setattr(store._journal, "_file", FullDisk(store._journal._file))
        path, body = requests[0]
        r = client.post(path, headers=headers, json=body)
        assert r.status_code == 503 and "charge is queued" in r.json()["error"]["message"], r.text
        usage_id, charged = r.headers["x-service-response-id"], Decimal(r.headers["x-service-cost"])
        assert charged > 0
        full["disk"] = False
        assert client.post(path, headers=headers, json=body).status_code == 200  # the disk has room
        for _ in range(200):
            found = client.get(f"/v1/usage/{usage_id}", headers=headers)
            if found.status_code == 200:
                break
            time.sleep(0.02)
        assert found.status_code == 200, found.text
        assert found.json(parse_float=Decimal)["cost"] == charged

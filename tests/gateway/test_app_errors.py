"""The app's error handling in-process: anything unexpected is a 500 api_error, never a traceback."""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.testclient import TestClient

from gateway.app import create_app
from gateway.config import ChannelConfig, ModelConfig, Settings


def test_unexpected_exception_becomes_api_error(tmp_path: Path) -> None:
    settings = Settings(
        models=(ModelConfig("a/b", "chat", (ChannelConfig("openai", "http://127.0.0.1:9", "b"),)),),
        store_path=tmp_path / "g.db",
    )
    app = create_app(settings)

    async def explode(request: Request) -> Response:
        raise RuntimeError("secret internals")

    app.router.routes.append(Route("/boom", explode))
    with TestClient(app, raise_server_exceptions=False) as client:
        r = client.get("/boom")
    assert r.status_code == 500
    assert r.json() == {
        "error": {
            "message": "The gateway failed unexpectedly. Retry later.",
            "type": "api_error",
            "param": None,
            "code": "api_error",
        }
    }
    assert "secret" not in r.text

"""An upstream's error that quotes the credential it was sent (some OpenAI-compatible servers and
proxies say "Incorrect API key provided: <the header>", or dump the headers they refused) reaches
neither the client nor the request log: the channel's key is blanked out of what the gateway
passes on (security review: it was in the 400's message and the log's response body)."""

from __future__ import annotations

from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import httpx
import pytest

from harness import Gateway, bare_upstream, chat_model, eventually, gateway, send_json

OPENAI_KEY = "sk-upstream-" + "S3CRET" * 6
ANTHROPIC_KEY = "sk-ant-upstream-" + "K3Y" * 10


class _Quoting(BaseHTTPRequestHandler):
    """Refuses every request with a 400 whose message quotes its credential headers."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        said = {k: v for k, v in self.headers.items() if k.lower() in ("authorization", "x-api-key")}
        message = f"Incorrect API key provided: {self.headers.get('authorization')}. header dump {said}"
        send_json(self, 400, {"error": {"message": message, "type": "invalid_request_error"}})

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def quoting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with bare_upstream(_Quoting) as url:
        models = (
            chat_model("q/chat", "c", url).rstrip()
            + '\napi_key_env = "QUOTED_OPENAI_KEY"\n'
            + chat_model("q/claude", "m", url, type_="messages", provider="anthropic").rstrip()
            + '\napi_key_env = "QUOTED_ANTHROPIC_KEY"\n'
        )
        env = {"QUOTED_OPENAI_KEY": OPENAI_KEY, "QUOTED_ANTHROPIC_KEY": ANTHROPIC_KEY}
        with gateway(tmp_path_factory.mktemp("quoting"), models, env=env) as g:
            yield g


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"model": "q/chat", "messages": [{"role": "user", "content": "hi"}]}),
        (
            "/v1/messages",
            {"model": "q/claude", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]},
        ),
    ],
)
def test_an_upstream_quoting_its_key_does_not_show_it(
    quoting: Gateway, path: str, body: dict[str, Any]
) -> None:
    key = quoting.new_key()
    r = httpx.post(quoting.url + path, json=body, headers={"authorization": f"Bearer {key.key}"}, timeout=30)
    assert r.status_code == 400, r.text
    assert "Incorrect API key provided" in r.text and "[redacted]" in r.text
    assert OPENAI_KEY not in r.text and ANTHROPIC_KEY not in r.text
    request_id = r.headers["x-service-request-id"]

    def logged() -> list[tuple[Any, ...]]:
        return quoting.query("SELECT response_body FROM request_logs WHERE id = ?", request_id)

    ((logged_body,),) = eventually(logged, 10, 0.05, what="the request's log entry")
    assert logged_body and "[redacted]" in str(logged_body)
    assert OPENAI_KEY not in str(logged_body) and ANTHROPIC_KEY not in str(logged_body)

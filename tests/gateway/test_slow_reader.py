"""A stream whose client stays connected but stops reading: the gateway's buffers stay bounded, what
it bills is what the connection could take, and after [limits] send_idle_timeout_seconds the client
is given up as one that left (docs/behaviour.md, "A client that leaves")."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import pytest

from gateway.core import count_tokens
from harness import Gateway, chat_model, gateway

TOKENS = 70_000  # about 14 MB of chat chunks: far more than a connection's buffers
KEY_ENV = "TEST_GEMINI_API_KEY"


def _models(sim_url: str) -> str:
    # Its channel's key follows the channel's table, which chat_model ends with.
    gemini = chat_model("google/gemini-2.5-flash", "gemini-2.5-flash", sim_url, provider="gemini")
    return chat_model("openai/gpt-4o-mini", "gpt-4o-mini", sim_url) + gemini + f'api_key_env = "{KEY_ENV}"\n'


@pytest.fixture(scope="module")
def stalls(sim_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with gateway(
        tmp_path_factory.mktemp("stalls"),
        _models(sim_url),
        limits_toml="send_idle_timeout_seconds = 1",
        env={KEY_ENV: "gemini-key"},
    ) as g:
        yield g


def _stalled_stream(gw: Gateway, key: str, model: str) -> tuple[socket.socket, str, bytes]:
    """A stream request on a socket with a small receive buffer, its answer's head read, and then
    nothing more; returns the socket (still open), the request id and what came of the body."""
    body = json.dumps(
        {
            "model": model,
            "stream": True,
            "messages": [{"role": "user", "content": f"x [sim tokens={TOKENS}]"}],
        }
    ).encode()
    host, port = gw.url.removeprefix("http://").split(":")
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect((host, int(port)))
    s.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        + f"authorization: Bearer {key}\r\ncontent-length: {len(body)}\r\n\r\n".encode()
        + body
    )
    head = s.recv(2048)
    assert head.startswith(b"HTTP/1.1 200"), head[:300]
    request_id = head.split(b"x-service-request-id: ", 1)[1].split(b"\r\n", 1)[0].decode()
    return s, request_id, head.split(b"\r\n\r\n", 1)[1]


def _rest(s: socket.socket, got: bytes) -> bytes:
    """Everything the connection still delivers, after `got`, until it ends or falls silent."""
    s.settimeout(5)
    parts = [got]
    try:
        while data := s.recv(1 << 16):
            parts.append(data)
    except TimeoutError:
        pass
    return b"".join(parts)


def _said(chunked: bytes) -> str:
    """The text of a chat stream's content deltas in a chunked body, as far as it is whole."""
    body, at = [], 0
    while (end := chunked.find(b"\r\n", at)) >= 0:
        size = int(chunked[at:end], 16)
        if size == 0 or end + 2 + size > len(chunked):
            break
        body.append(chunked[end + 2 : end + 2 + size])
        at = end + 4 + size
    text = []
    for line in b"".join(body).split(b"\n"):
        if line.startswith(b"data: {"):
            for choice in json.loads(line[6:]).get("choices", []):
                text.append(choice.get("delta", {}).get("content") or "")
    return "".join(text)


@pytest.mark.parametrize("model", ["openai/gpt-4o-mini", "google/gemini-2.5-flash"])
def test_a_client_that_stops_reading_is_given_up_and_billed_what_could_reach_it(
    stalls: Gateway, model: str
) -> None:
    """Review: through a translated upstream (Gemini's), each chunk handed to the server was a whole
    upstream read translated (1.7 MB), and the server takes four before a write waits: a client
    that read nothing had the whole 14 MB stream read, held in the worker and billed, for as long
    as it kept its connection open. Now 64 KB at a time, and given up after the idle time."""
    handle = stalls.new_key(balance="10")
    s, request_id, got = _stalled_stream(stalls, handle.key, model)
    try:
        deadline = time.monotonic() + 15
        rows: list[tuple[object, ...]] = []
        while time.monotonic() < deadline and not rows:
            time.sleep(0.25)
            rows = stalls.query("SELECT status, response_bytes FROM request_logs WHERE id = ?", request_id)
        # Ended by the gateway while the client still holds its connection: logged as one that left.
        assert rows, "the stalled stream was never given up"
        ((status, sent),) = rows
        assert status == 499
        # The log entry and the charge are settled together (one settlement, one commit).
        ((completion, outcome),) = stalls.query(
            "SELECT completion_tokens, status FROM usage_records WHERE account_id = ?", handle.account_id
        )
        assert outcome == "incomplete"
        # Billed for what the connection's buffers could take: a small part of the stream.
        assert 0 < completion < TOKENS // 3, (completion, sent)
        assert isinstance(sent, int) and sent < 6 * 1024 * 1024
        # ... and no less than the client can still read of it (review: a chunk cut short when the
        # client was given up went unbilled, up to 8,000 tokens).
        received = count_tokens(_said(_rest(s, got)))
        assert received <= completion <= received + 200, (received, completion)
    finally:
        s.close()

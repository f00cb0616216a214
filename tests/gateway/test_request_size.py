"""The 10 MB request limit (spec 8): enforced while the body is read, so a larger body is refused
with 413 request_too_large before it is buffered whole and never reaches a model."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import httpx
import orjson

from harness import Gateway, KeyHandle, chat_model, gateway, read_json_answer

LIMIT = 10 * 1024 * 1024
CHAT = "/v1/chat/completions"


def raw_post(gw: Gateway, key: str, head_extra: str, body: bytes) -> bytes:
    """Send the headers and `body` (possibly much less than announced) and read the answer."""
    url = urlparse(gw.url)
    with socket.create_connection((url.hostname, url.port), timeout=10) as s:
        s.sendall(
            (
                f"POST {CHAT} HTTP/1.1\r\nHost: {url.netloc}\r\nAuthorization: Bearer {key}\r\n"
                f"Content-Type: application/json\r\n{head_extra}\r\n"
            ).encode()
            + body
        )
        return read_json_answer(s)


def test_a_declared_10_mb_plus_1_is_refused_before_the_body_arrives(gw: Gateway, key: KeyHandle) -> None:
    # Only 100 bytes of the announced body are ever sent: the answer cannot have waited for it.
    answer = raw_post(gw, key.key, f"Content-Length: {LIMIT + 1}\r\n", b"{" + b" " * 99)
    assert answer.startswith(b"HTTP/1.1 413")
    assert b'"code":"request_too_large"' in answer and b'"type":"invalid_request_error"' in answer
    # The rest of the body is never read: the connection closes, and the client is told so.
    assert b"\r\nconnection: close\r\n" in answer.lower()


def test_a_chunked_body_is_refused_once_it_passes_the_limit(gw: Gateway, key: KeyHandle) -> None:
    def body() -> Iterator[bytes]:
        yield b'{"model": "openai/gpt-4o-mini", "messages": [{"role": "user", "content": "'
        for _ in range(LIMIT // 65536 + 1):
            yield b"a" * 65536

    with gw.client(key.key) as c:
        try:
            r = c.post(CHAT, content=body(), headers={"content-type": "application/json"})
        except httpx.HTTPError:  # the gateway may close while the client still sends: also a refusal
            return
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


def test_exactly_10_mb_is_read_and_then_judged_on_its_content(gw: Gateway, key: KeyHandle) -> None:
    prefix = b'{"model": "openai/gpt-4o-mini", "messages": [{"role": "user", "content": "'
    suffix = b'"}], "broken": '  # invalid JSON: judged (400), not refused for its size
    body = prefix + b"a" * (LIMIT - len(prefix) - len(suffix)) + suffix
    assert len(body) == LIMIT
    with gw.client(key.key) as c:
        r = c.post(CHAT, content=body, headers={"content-type": "application/json"})
        over = c.post(CHAT, content=body + b" ", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request"
    assert over.status_code == 413 and over.json()["error"]["code"] == "request_too_large"


def test_a_body_that_stops_arriving_is_answered_408_timeout(tmp_path: Path, sim_url: str) -> None:
    """A client that declares more than it sends is not waited on for ever ([limits]
    body_idle_timeout_seconds); one whose body keeps coming, however slowly, is."""
    models = chat_model("openai/gpt-4o-mini", "gpt-4o-mini", sim_url)
    with gateway(tmp_path, models, limits_toml="body_idle_timeout_seconds = 1") as g:
        key = g.new_key()
        started = time.monotonic()
        answer = raw_post(g, key.key, "Content-Length: 500\r\n", b'{"model": "openai/gpt-4o-mini"')
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b'"code":"timeout"' in answer and b"stopped arriving for 1 seconds" in answer
        assert time.monotonic() - started < 5
        # A chunked body too, saying its connection ends (review: the header was missing there).
        chunked = raw_post(g, key.key, "Transfer-Encoding: chunked\r\n", b'10\r\n{"model": "open')
        assert chunked.startswith(b"HTTP/1.1 408"), chunked[:200]
        assert b"\r\nconnection: close\r\n" in chunked.lower(), chunked[:400]
        # Slow but steady (a piece every 0.4 s, each within the idle window): answered in full.
        body = orjson.dumps({"model": "openai/gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]})

        def trickle() -> Iterator[bytes]:
            for i in range(0, len(body), len(body) // 4 + 1):
                time.sleep(0.4)
                yield body[i : i + len(body) // 4 + 1]

        with g.client(key.key) as c:
            r = c.post(CHAT, content=trickle(), headers={"content-type": "application/json"})
        assert r.status_code == 200, r.text


def test_a_body_still_arriving_as_the_synchronous_window_closes_is_504(tmp_path: Path, sim_url: str) -> None:
    """Spec 8: the window runs from the start of the request to its last byte, the body's arrival
    included: a body that trickles in, each piece within the idle time, is cut when it closes
    (operator review: a byte every few seconds held a request open past the window)."""
    models = chat_model("openai/gpt-4o-mini", "gpt-4o-mini", sim_url)
    limits = "body_idle_timeout_seconds = 1\nsync_timeout_seconds = 2"
    with gateway(tmp_path, models, limits_toml=limits) as g:
        key = g.new_key()
        body = orjson.dumps({"model": "openai/gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]})
        url = urlparse(g.url)
        started = time.monotonic()
        with socket.create_connection((url.hostname, url.port), timeout=10) as s:
            s.sendall(
                (
                    f"POST {CHAT} HTTP/1.1\r\nHost: {url.netloc}\r\nAuthorization: Bearer {key.key}\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                ).encode()
            )
            answer = b""
            for piece in body:  # a byte every 0.5 s: never idle for 1 s, never done within 2 s
                try:
                    s.sendall(bytes([piece]))
                except OSError:
                    break
                s.settimeout(0.5)
                try:
                    answer += s.recv(65536)
                except TimeoutError:
                    continue
                if answer:
                    break
            s.settimeout(5)
            answer = read_json_answer(s, answer)
        assert answer.startswith(b"HTTP/1.1 504"), answer[:300]
        assert b'"code":"timeout"' in answer and b"synchronous time window" in answer
        assert b"connection: close" in answer.lower()
        assert 1.8 < time.monotonic() - started < 4


def test_a_body_framed_two_ways_is_read_one_way_and_ends_its_connection(gw: Gateway, key: KeyHandle) -> None:
    """Content-Length beside Transfer-Encoding: the server (Granian's hyper) drops the length, reads
    the chunked body and closes the connection after its answer, as RFC 9112 (6.3) asks, so that a
    proxy in front that went by the length cannot slip a second request into the connection. Two
    Content-Lengths that differ are refused before the gateway (400)."""
    body = orjson.dumps({"model": "openai/gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]})
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    # A length of 5 would cut the JSON: the answer is the whole body's.
    answer = raw_post(gw, key.key, "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", chunked)
    head = answer.partition(b"\r\n\r\n")[0].lower()
    assert head.startswith(b"http/1.1 200") and b"connection: close" in head, answer
    answer = raw_post(
        gw, key.key, f"Content-Length: {len(body)}\r\nContent-Length: {len(body) + 1}\r\n", body
    )
    assert answer.startswith(b"HTTP/1.1 400"), answer

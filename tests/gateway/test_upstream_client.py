"""The upstream HTTP client (providers/http.py) against servers that answer exactly as each test says,
on real sockets: every way an answer's body is framed, keep-alive reuse and when a connection must
not be reused, timeouts, refusals, malformed answers, the connection limit, TLS."""

from __future__ import annotations

import asyncio
import datetime as dt
import gc
import ipaddress
import itertools
import os
import ssl
import time
import weakref
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.config import Settings
from gateway.providers import http
from gateway.providers.http import (
    UNSENT_FAILURES,
    UPSTREAM_FAILURES,
    UpstreamClient,
    UpstreamProtocolError,
    is_timeout,
)
from harness import free_port

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Upstream:
    """A server whose every connection runs `handler` per request; counts connections."""

    def __init__(self, answer: Callable[[int], list[bytes] | None], pause: float = 0.0) -> None:
        self.answer = answer  # request number -> the pieces to write (None: write nothing, hold)
        self.pause = pause  # between pieces
        self.connections = 0
        self.open = 0
        self.most_open = 0
        self.requests = 0
        self.closed_by_client = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    self.closed_by_client += 1
                    return
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length")
                    ),
                    0,
                )
                await reader.readexactly(length)
                self.requests += 1
                pieces = self.answer(self.requests)
                if pieces is None:
                    await asyncio.sleep(3600)
                    return
                for piece in pieces:
                    if piece == b"<close>":
                        writer.close()
                        return
                    writer.write(piece)
                    await writer.drain()
                    if self.pause:
                        await asyncio.sleep(self.pause)
        finally:
            self.open -= 1
            writer.close()


async def serve(upstream: Upstream, tls: ssl.SSLContext | None = None) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(upstream.handle, "127.0.0.1", 0, ssl=tls)
    port = server.sockets[0].getsockname()[1]
    return server, f"{'https' if tls else 'http'}://127.0.0.1:{port}"


def client(limit: int = 100, connect_timeout: float = 5.0) -> UpstreamClient:
    return UpstreamClient(
        Settings(models=(), upstream_max_connections=limit, upstream_connect_timeout_seconds=connect_timeout)
    )


def run(test: Callable[[UpstreamClient], Awaitable[None]], c: UpstreamClient | None = None) -> None:
    async def go() -> None:
        upstream_client = c or client()
        await upstream_client.start()
        try:
            await test(upstream_client)
        finally:
            await upstream_client.close()

    asyncio.run(go())


def ok(body: bytes, extra: bytes = b"") -> list[bytes]:
    return [
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        + extra
        + b"Content-Length: %d\r\n\r\n" % len(body)
        + body
    ]


def chunked(body: bytes, size: int) -> bytes:
    out = b""
    for i in range(0, len(body), size):
        part = body[i : i + size]
        out += b"%x;ext=1\r\n" % len(part) + part + b"\r\n"
    return out + b"0\r\nX-Trailer: t\r\n\r\n"


def test_content_length_answers_reuse_one_connection() -> None:
    upstream = Upstream(lambda n: ok(b'{"n": %d}' % n))

    async def test(c: UpstreamClient) -> None:
        server, url = await serve(upstream)
        async with server:
            for n in (1, 2, 3):
                response = await c.post(url + "/v1/chat/completions", b"{}", {"x-a": "1"}, 5)
                assert response.status == 200 and response.headers["content-type"] == "application/json"
                assert await response.read() == b'{"n": %d}' % n
                response.release()
        assert upstream.connections == 1 and upstream.requests == 3

    run(test)


def test_an_answer_is_freed_as_soon_as_it_is_let_go() -> None:
    # No reference cycle: an answer (its body, headers, connection) must not wait for the garbage
    # collector, which would otherwise run every few thousand requests to find them.
    upstream = Upstream(lambda n: ok(b'{"n": %d}' % n))

    async def test(c: UpstreamClient) -> None:
        server, url = await serve(upstream)
        async with server:
            response = await c.post(url + "/x", b"{}", {}, 5)
            assert await response.content.read() == b'{"n": 1}'
            response.release()
            gone = weakref.ref(response)
            del response
            await asyncio.sleep(0)  # the loop's wake-up of this task held the head's future a moment
            assert gone() is None

    gc.disable()
    try:
        run(test)
    finally:
        gc.enable()


@settings(max_examples=30, deadline=None)
@given(st.binary(max_size=3000), st.integers(1, 700), st.integers(1, 97))
def test_a_chunked_body_decodes_exactly_however_it_is_split(body: bytes, size: int, piece: int) -> None:
    encoded = chunked(body, size)
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    raw = head + encoded
    upstream = Upstream(lambda n: [raw[i : i + piece] for i in range(0, len(raw), piece)])

    async def test(c: UpstreamClient) -> None:
        server, url = await serve(upstream)
        async with server:
            for _ in range(2):
                response = await c.post(url + "/x", b"", {}, 5)
                got = b"".join([chunk async for chunk in response.content.iter_any()])
                response.release()
                assert got == body
        assert upstream.connections == 1  # the trailer read, the connection went back

    run(test)


def test_a_body_framed_by_the_close_and_connection_close_are_not_reused() -> None:
    answers = {
        1: [b"HTTP/1.1 200 OK\r\n\r\nto the end", b"<close>"],
        2: ok(b"bye", b"Connection: close\r\n"),
        3: ok(b"fresh"),
    }
    upstream = Upstream(lambda n: answers[n])

    async def test(c: UpstreamClient) -> None:
        server, url = await serve(upstream)
        async with server:
            bodies = []
            for _ in range(3):
                response = await c.post(url + "/x", b"", {}, 5)
                bodies.append(await response.read())
                response.release()
                await asyncio.sleep(0.05)
            assert bodies == [b"to the end", b"bye", b"fresh"]
        assert upstream.requests == 3

    run(test)


def test_informational_heads_are_skipped_and_empty_bodies_end_at_once() -> None:
    answers = {
        1: [b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n", *ok(b"after hints")],
        2: [b"HTTP/1.1 204 No Content\r\n\r\n"],
        3: ok(b"again"),
    }
    upstream = Upstream(lambda n: answers[n])

    async def test(c: UpstreamClient) -> None:
        server, url = await serve(upstream)
        async with server:
            first = await c.post(url + "/x", b"", {}, 5)
            assert first.status == 200 and await first.read() == b"after hints"
            first.release()
            empty = await c.post(url + "/x", b"", {}, 5)
            assert empty.status == 204 and await empty.read() == b""
            empty.release()
            again = await c.post(url + "/x", b"", {}, 5)
            assert await again.read() == b"again"
            again.release()
        assert upstream.connections == 1

    run(test)


@settings(max_examples=15, deadline=None)
@given(cuts=st.lists(st.integers(1, 120), min_size=1, max_size=12))
def test_heads_however_they_are_split_are_read_whole(cuts: list[int]) -> None:
    # An early hint, then the answer, written in pieces cut anywhere (heads and the body alike).
    raw = b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + ok(b"split", b"X-Value:  v \r\n")[0]
    bounds = sorted({0, len(raw), *(min(c, len(raw)) for c in cuts)})
    upstream = Upstream(lambda n: [raw[a:b] for a, b in itertools.pairwise(bounds)], pause=0.002)

    async def test(c: UpstreamClient) -> None:
        server, url = await serve(upstream)
        async with server:
            response = await c.post(url + "/x", b"", {}, 5)
            try:
                assert (response.status, response.headers["x-value"]) == (200, "v")
                assert await response.read() == b"split"
            finally:
                response.release()

    run(test)


def test_a_head_that_trickles_past_its_limit_fails_without_waiting_for_its_end() -> None:
    piece = b"X: " + b"a" * 8_000 + b"\r\n"
    upstream = Upstream(lambda n: [b"HTTP/1.1 200 OK\r\n", *[piece] * 10])  # then silence, never its end

    async def test(c: UpstreamClient) -> None:
        server, url = await serve(upstream)
        async with server:
            with pytest.raises(UpstreamProtocolError, match="too large"):
                await c.post(url + "/x", b"", {}, 5)

    run(test)


def test_a_body_left_unread_closes_its_connection() -> None:
    upstream = Upstream(
        lambda n: [b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n12345"] if n == 1 else ok(b"x")
    )

    async def test(c: UpstreamClient) -> None:
        server, url = await serve(upstream)
        async with server:
            response = await c.post(url + "/x", b"", {}, 5)
            response.release()  # half of it unread: the connection cannot be reused
            again = await c.post(url + "/x", b"", {}, 5)
            assert await again.read() == b"x"
            again.release()
        assert upstream.connections == 2

    run(test)


def test_silence_is_a_read_timeout_before_the_head_and_within_the_body() -> None:
    answers: dict[int, list[bytes] | None] = {1: None}
    upstream = Upstream(answers.get)

    async def test(c: UpstreamClient) -> None:
        server, url = await serve(upstream)
        async with server:
            with pytest.raises(UPSTREAM_FAILURES) as head:
                await c.post(url + "/x", b"", {}, 0.2)
            assert is_timeout(head.value)

    run(test)

    stalling = Upstream(lambda n: [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"])

    async def body(c: UpstreamClient) -> None:
        server, url = await serve(stalling)
        async with server:
            response = await c.post(url + "/x", b"", {}, 0.2)
            chunks = response.content.iter_any()
            assert await anext(chunks) == b"hello"
            with pytest.raises(UPSTREAM_FAILURES) as caught:
                await anext(chunks)
            assert is_timeout(caught.value)
            response.release()

    run(body)


def test_a_body_that_keeps_coming_never_times_out_and_silence_after_it_does() -> None:
    # Twelve pieces 0.1 s apart (1.2 s in all) under a 0.25 s read timeout: never that long a
    # silence. Then the answer stops mid-body: a timeout, about 0.25 s after the last piece.
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    dripping = Upstream(lambda n: [head, *(b"1\r\nx\r\n" for _ in range(12))], pause=0.1)

    async def test(c: UpstreamClient) -> None:
        server, url = await serve(dripping)
        async with server:
            response = await c.post(url + "/x", b"", {}, 0.25)
            received = b""
            last = time.monotonic()
            with pytest.raises(UPSTREAM_FAILURES) as caught:
                async for chunk in response.content.iter_any():
                    received += chunk
                    last = time.monotonic()
            assert is_timeout(caught.value)
            assert received == b"x" * 12
            assert 0.2 <= time.monotonic() - last < 1.0
            response.release()

    run(test)


def test_a_kept_alive_connection_times_out_by_each_request_s_own_read_timeout() -> None:
    """The read timer outlives an answer on its connection (providers/http.py, _touch): the next
    request on it, with a shorter read timeout than the first's, must still time out by its own."""
    answers: dict[int, list[bytes] | None] = {1: ok(b"{}"), 2: None}
    upstream = Upstream(answers.get)

    async def test(c: UpstreamClient) -> None:
        server, url = await serve(upstream)
        async with server:
            first = await c.post(url + "/x", b"", {}, 30.0)
            assert await first.read() == b"{}"
            first.release()
            started = time.monotonic()
            with pytest.raises(UPSTREAM_FAILURES) as caught:
                await c.post(url + "/x", b"", {}, 0.2)
            assert is_timeout(caught.value)
            assert 0.15 <= time.monotonic() - started < 2.0
            assert upstream.connections == 1  # the second request went on the first's connection

    run(test)


def test_refused_connections_are_unsent_and_cut_answers_are_not() -> None:
    async def refused(c: UpstreamClient) -> None:
        with pytest.raises(UNSENT_FAILURES):
            await c.post(f"http://127.0.0.1:{free_port()}/x", b"", {}, 5)

    run(refused)
    upstream = Upstream(lambda n: [b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial", b"<close>"])

    async def cut(c: UpstreamClient) -> None:
        server, url = await serve(upstream)
        async with server:
            response = await c.post(url + "/x", b"", {}, 5)
            with pytest.raises(UPSTREAM_FAILURES) as caught:
                await response.read()
            assert not isinstance(caught.value, UNSENT_FAILURES)
            response.release()

    run(cut)


@pytest.mark.parametrize(
    "answer",
    [
        b"SPDY/3 200 OK\r\n\r\n",
        b"HTTP/1.1 two hundred\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70_000 + b"\r\n\r\n",
    ],
)
def test_malformed_answers_fail_as_the_upstream_s_fault(answer: bytes) -> None:
    upstream = Upstream(lambda n: [answer])

    async def test(c: UpstreamClient) -> None:
        server, url = await serve(upstream)
        async with server:
            with pytest.raises(UPSTREAM_FAILURES) as caught:
                response = await c.post(url + "/x", b"", {}, 2)
                try:
                    await response.read()
                finally:
                    response.release()
            assert isinstance(caught.value, UpstreamProtocolError)

    run(test)


def test_the_connection_limit_holds_requests_until_one_is_released() -> None:
    upstream = Upstream(lambda n: ok(b"%d" % n), pause=0.05)

    async def test(c: UpstreamClient) -> None:
        server, url = await serve(upstream)
        async with server:

            async def one() -> bytes:
                response = await c.post(url + "/x", b"", {}, 5)
                try:
                    return await response.read()
                finally:
                    response.release()

            bodies = await asyncio.gather(*(one() for _ in range(5)))
        assert sorted(bodies) == [b"1", b"2", b"3", b"4", b"5"]
        assert upstream.most_open == 1

    run(test, client(limit=1))


def test_an_idle_connection_the_upstream_closed_is_not_used() -> None:
    upstream = Upstream(lambda n: ok(b"x", b"Keep-Alive: timeout=0\r\n") + ([b"<close>"] if n == 1 else []))

    async def test(c: UpstreamClient) -> None:
        server, url = await serve(upstream)
        async with server:
            for _ in range(2):
                response = await c.post(url + "/x", b"", {}, 5)
                assert await response.read() == b"x"
                response.release()
                await asyncio.sleep(0.05)  # the upstream's close arrives while it is idle
        assert upstream.connections == 2 and upstream.requests == 2

    run(test)


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "upstream.test")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp / "cert.pem", tmp / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_file, key_file


def test_https_upstreams_are_verified_against_the_trust_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert_file, key_file = _self_signed(tmp_path)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert_file, key_file)
    upstream = Upstream(lambda n: ok(b"secret"))

    async def untrusted(c: UpstreamClient) -> None:
        server, url = await serve(upstream, tls)
        async with server:
            with pytest.raises(UNSENT_FAILURES):  # not in the trust store: refused before sending
                await c.post(url + "/x", b"", {}, 5)

    run(untrusted)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert_file))  # the system trust store, as openssl reads it

    async def trusted(c: UpstreamClient) -> None:
        server, url = await serve(upstream, tls)
        async with server:
            for _ in range(2):
                response = await c.post(url + "/x", b"", {}, 5)
                assert await response.read() == b"secret"
                response.release()

    run(trusted)
    assert upstream.requests == 2 and os.environ["SSL_CERT_FILE"] == str(cert_file)


def heads_kept(heads: list[bytes]) -> Handler:
    """A connection handler that keeps each request's head in `heads` and answers `{}`, one request
    per connection."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        heads.append(head)
        declared = [line for line in head.split(b"\r\n") if line.startswith(b"Content-Length:")]
        await reader.readexactly(int(declared[0].split(b":")[1]))
        writer.write(ok(b"{}", b"Connection: close\r\n")[0])
        await writer.drain()
        writer.close()

    return handle


def test_the_request_head_says_host_and_length_and_no_line_breaks_get_through() -> None:
    heads: list[bytes] = []
    handle = heads_kept(heads)

    async def test(c: UpstreamClient) -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            response = await c.post(
                f"http://127.0.0.1:{port}/v1/x?a=1", b"{}", {"Authorization": "Bearer k", "Host": "evil"}, 5
            )
            assert await response.read() == b"{}"
            response.release()
            with pytest.raises(UNSENT_FAILURES):
                await c.post(f"http://127.0.0.1:{port}/v1/x", b"{}", {"x-a": "1\r\nInjected: yes"}, 5)
            # A URL an upstream answered with (an image's): never a line break or a space in the
            # request line, and a port that is no port is refused before anything is sent.
            odd = await c.get(f"http://127.0.0.1:{port}/files/a b\r\nX: y?q=é&r=%20", 5)
            assert await odd.read() == b"{}"
            odd.release()
            with pytest.raises(UNSENT_FAILURES):
                await c.get("http://127.0.0.1:99999/x", 5)
        head, odd_head = heads
        lines = head.decode().split("\r\n")
        assert lines[0] == "POST /v1/x?a=1 HTTP/1.1"
        assert f"Host: 127.0.0.1:{port}" in lines and "Host: evil" not in lines
        assert "Authorization: Bearer k" in lines and "Content-Length: 2" in lines
        # (urlsplit drops tabs and line breaks from a URL, as browsers do.)
        assert odd_head.split(b"\r\n")[0] == b"GET /files/a%20bX:%20y?q=%C3%A9&r=%20 HTTP/1.1"

    run(test)


def test_request_lines_stay_right_for_each_method_and_url_while_their_parse_is_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each URL's request line is parsed once and kept, at most MAX_TARGETS of them: the method is
    # still each request's own, and URLs past the bound (parsed afresh) come out the same.
    monkeypatch.setattr(http, "MAX_TARGETS", 2)
    heads: list[bytes] = []
    handle = heads_kept(heads)

    sent: list[str] = []

    async def test(c: UpstreamClient) -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            for n in (1, 1, 2, 3, 1, 4, 2):
                url = f"http://127.0.0.1:{port}/v1/x?n={n}"
                for method in ("POST", "GET"):
                    response = await (c.post(url, b"{}", {}, 5) if method == "POST" else c.get(url, 5))
                    assert await response.read() == b"{}"
                    response.release()
                    sent.append(f"{method} /v1/x?n={n} HTTP/1.1")
                with pytest.raises(UNSENT_FAILURES):  # a bad URL is refused each time, never kept
                    await c.post(f"ftp://127.0.0.1:{port}/v1/x", b"{}", {}, 5)
        assert [head.split(b"\r\n")[0].decode() for head in heads] == sent
        assert all(f"Host: 127.0.0.1:{port}".encode() in head for head in heads)

    run(test)

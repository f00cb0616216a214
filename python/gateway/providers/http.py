"""The one upstream HTTP client: a pool of HTTP/1.1 keep-alive connections shared by every upstream
call, written for the gateway's one job (send a request, hand back its answer, plain or as it
streams) on asyncio's transports.

Measured on this machine (a small chat completion to the simulator, one request at a time, client
pinned to one core): aiohttp's client took 304 us a request and this one 196 us; httpx's own
transport had been several times slower than aiohttp at concurrency 64 (290 against 2,860
requests/s through a Granian worker). aiohttp's request and response models, its timers and its
tracing hooks cost more than the HTTP itself, so the hot path talks to this and nothing else.

What it does: HTTP/1.1 requests with a Content-Length body; answers framed by Content-Length, by
chunked transfer coding (trailers read and dropped) or by the connection's close; TLS with the
system's trust store for https; a connect timeout, and a read timeout that is the longest silence
allowed between two reads (the head included). A connection goes back to the pool only once its
answer was read to the end without `Connection: close`; idle ones are dropped after
KEEPALIVE_SECONDS, or as soon as the upstream closes them. No proxies, redirects, cookies or
decompression: bodies pass through exactly as the upstream encoded them.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping
from typing import Final, cast
from urllib.parse import quote, urlsplit

from multidict import CIMultiDict, CIMultiDictProxy

from ..config import Settings
from ..core import InvalidHttpError, parse_response_head

KEEPALIVE_SECONDS: Final = 30.0
MAX_HEAD_BYTES: Final = 64 * 1024  # status line and headers of an answer
# A streamed body waiting for its reader pauses the socket past this, and resumes below a quarter.
PAUSE_BYTES: Final = 1024 * 1024
RESUME_BYTES: Final = PAUSE_BYTES // 4
# The most of a body one read hands on (iter_any). A stream's reader turns each into one chunk for
# its client, and what it bills advances a chunk at a time: a chunk cut short when its client is
# given up (routes/common.py, SendStall) goes unbilled, so a backlog of a megabyte must not be one.
READ_PIECE_BYTES: Final = 32 * 1024


class UpstreamConnectError(ConnectionError):
    """The connection could not be made: nothing was sent."""


class ConnectTimeout(TimeoutError):
    """The connection was not made in time: nothing was sent."""


class ReadTimeout(TimeoutError):
    """The upstream was silent longer than the read timeout."""


class UpstreamProtocolError(ConnectionError):
    """The upstream's answer is not HTTP/1.1 as this client reads it."""


# Everything an upstream call can raise for reasons of the network or the upstream, not of our code.
UPSTREAM_FAILURES = (TimeoutError, OSError)
# Those of them that come before the request was sent (no connection): safe to send again.
UNSENT_FAILURES = (UpstreamConnectError, ConnectTimeout)


def is_timeout(exc: BaseException) -> bool:
    return isinstance(exc, TimeoutError)


class UpstreamClient:
    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._pool: _Pool | None = None

    async def start(self) -> None:
        self._pool = _Pool(
            self._settings.upstream_max_connections, self._settings.upstream_connect_timeout_seconds
        )

    async def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    async def post(
        self, url: str, body: bytes, headers: Mapping[str, str], read_timeout: float
    ) -> UpstreamResponse:
        """Send and return once the response head arrived; the body is left for the caller.

        read_timeout is the longest silence allowed from the upstream between any two reads.
        Raises one of UPSTREAM_FAILURES.
        """
        return await self._started().request("POST", url, body, headers, read_timeout)

    async def get(
        self, url: str, read_timeout: float, headers: Mapping[str, str] | None = None
    ) -> UpstreamResponse:
        """GET a file an upstream answer links to (an image URL), without credentials unless
        `headers` carry them (a video job's state and file); otherwise as post. Asks for identity
        encoding: the bytes are kept as they come."""
        wanted = {**(headers or {}), "accept-encoding": "identity"}
        return await self._started().request("GET", url, b"", wanted, read_timeout)

    async def delete(self, url: str, read_timeout: float, headers: Mapping[str, str]) -> UpstreamResponse:
        """DELETE what an upstream keeps (a stored response), with the credentials in `headers`;
        otherwise as post."""
        return await self._started().request("DELETE", url, b"", headers, read_timeout)

    def _started(self) -> _Pool:
        if self._pool is None:
            raise RuntimeError("the upstream client is started in the app's lifespan")
        return self._pool


_Origin = tuple[str, str, int]  # scheme, host, port
# What a request target may hold as it is (RFC 3986's reserved and unreserved characters, and `%`).
_URL_SAFE: Final = "/?#[]@!$&'()*+,;=:%-._~"
# Past this many URLs (those of files an upstream linked to vary) the parsed ones start again empty.
MAX_TARGETS: Final = 1024


def _target(url: str) -> tuple[_Origin, str]:
    """The origin a URL names and its request line after the method, with the Host header:
    `/v1/chat/completions HTTP/1.1\\r\\nHost: api.example.com\\r\\n`."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port or (443 if scheme == "https" else 80)
    except ValueError:  # a port out of range, or not a number (a URL an upstream answered with)
        port = 0
    if scheme not in ("http", "https") or not parts.hostname or not port:
        raise UpstreamConnectError(f"not an http(s) URL: {url[:200]!r}")
    # Spaces, control characters and non-ASCII are percent-encoded, escapes already there kept.
    target = quote((parts.path or "/") + (f"?{parts.query}" if parts.query else ""), safe=_URL_SAFE)
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname  # an IPv6 literal
    if port != (443 if scheme == "https" else 80):
        host = f"{host}:{port}"
    return (scheme, parts.hostname, port), f"{target} HTTP/1.1\r\nHost: {host}\r\n"


class _Pool:
    """Idle keep-alive connections by origin, and at most `limit` connections open at once
    (a request beyond it waits for one to be released)."""

    def __init__(self, limit: int, connect_timeout: float) -> None:
        self._limit = limit
        self._connect_timeout = connect_timeout
        self._idle: dict[_Origin, deque[_Connection]] = {}
        self._open = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._tls: ssl.SSLContext | None = None
        self._closed = False
        # Each URL's origin and the rest of its request line with the Host header, parsed once: a
        # channel's few URLs come back on every request (the parse was ~4 µs warm, ~20 cold).
        self._targets: dict[str, tuple[_Origin, str]] = {}

    async def request(
        self, method: str, url: str, body: bytes, headers: Mapping[str, str], read_timeout: float
    ) -> UpstreamResponse:
        found = self._targets.get(url)
        if found is None:
            if len(self._targets) >= MAX_TARGETS:
                self._targets.clear()
            found = self._targets[url] = _target(url)
        origin, line = found
        head = [f"{method} {line}"]
        for name, value in headers.items():
            if "\n" in name or "\r" in name or "\n" in value or "\r" in value:
                raise UpstreamConnectError(f"the header {name!r} holds a line break: not sent")
            if name.lower() not in ("host", "content-length", "transfer-encoding", "connection"):
                head.append(f"{name}: {value}\r\n")
        head.append(f"Content-Length: {len(body)}\r\n\r\n")
        request = "".join(head).encode() + body
        for tries_left in (1, 0):
            connection, reused = await self._acquire(origin)
            try:
                return await connection.send(request, method, read_timeout)
            except UpstreamConnectError:
                connection.abort()
                # An idle connection the upstream closed just now, before anything was sent on it:
                # once more on a new one.
                if not (reused and tries_left):
                    raise
            except BaseException:
                connection.abort()
                raise
        raise AssertionError("unreachable")

    async def _acquire(self, origin: _Origin) -> tuple[_Connection, bool]:
        """A connection to `origin`, and whether it was an idle one (else it is new)."""
        while True:
            idle = self._idle.get(origin)
            while idle:
                connection = idle.pop()  # the most recently used: the least likely to have timed out
                if connection.reusable():
                    return connection, True
                connection.abort()
            if not self._limit or self._open < self._limit:
                break
            # At the limit: make room by closing another origin's idle connection, or wait for one
            # to be released or closed.
            self._drop_one_idle()
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if not waiter.done():
                    waiter.cancel()
        self._open += 1
        try:
            return await self._connect(origin), False
        except BaseException:
            self._closed_one()
            raise

    async def _connect(self, origin: _Origin) -> _Connection:
        scheme, host, port = origin
        loop = asyncio.get_running_loop()
        tls: ssl.SSLContext | None = None
        if scheme == "https":
            if self._tls is None:
                self._tls = ssl.create_default_context()
            tls = self._tls
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, connection = await loop.create_connection(
                    lambda: _Connection(self, origin),
                    host,
                    port,
                    ssl=tls,
                    server_hostname=host if tls else None,
                )
        except TimeoutError as exc:
            raise ConnectTimeout(
                f"connecting to {host}:{port} took longer than {self._connect_timeout:g} s"
            ) from exc
        except OSError as exc:
            raise UpstreamConnectError(f"cannot connect to {host}:{port}: {exc}") from exc
        return connection

    def release(self, connection: _Connection) -> None:
        """An answer read to its end: the connection waits for the next request of its origin."""
        if self._closed or not connection.reusable():
            connection.abort()
            return
        connection.idle_since = time.monotonic()
        self._idle.setdefault(connection.origin, deque()).append(connection)
        self._wake_one()

    def _closed_one(self) -> None:
        self._open -= 1
        self._wake_one()

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _drop_one_idle(self) -> bool:
        """Close an idle connection of any origin to make room; False when there is none."""
        for idle in self._idle.values():
            if idle:
                idle.popleft().abort()
                return True
        return False

    def forget(self, connection: _Connection) -> None:
        """A connection closed (by either side)."""
        idle = self._idle.get(connection.origin)
        if idle and connection in idle:
            idle.remove(connection)
        self._closed_one()

    def close(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            while idle:
                idle.pop().abort()
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_exception(UpstreamConnectError("the upstream client is closed"))


class _Connection(asyncio.Protocol):
    """One connection to an upstream: one request at a time, its answer parsed as it arrives."""

    def __init__(self, pool: _Pool, origin: _Origin) -> None:
        self._pool = pool
        self.origin = origin
        # Made by the loop's create_connection, used on that loop only: kept, since each
        # asyncio.get_running_loop() is a getpid(2) on CPython 3.11, and a read asks for it.
        self._loop = asyncio.get_running_loop()
        self.idle_since = time.monotonic()
        self._transport: asyncio.Transport | None = None
        self._closed = False
        self._response: UpstreamResponse | None = None
        self._head_waiter: asyncio.Future[UpstreamResponse] | None = None
        self._buffer = bytearray()
        self._method = "POST"
        self._timer: asyncio.TimerHandle | None = None
        self._timer_due = 0.0  # loop time the timer fires at
        self._read_timeout = 0.0
        self._last_read = 0.0  # loop time of the last bytes (or the request): when silence began
        self._keep_alive = True
        self._paused = False

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is one, not a subclass

    def data_received(self, data: bytes) -> None:
        self._touch()
        if self._response is None:
            if self._head_waiter is None:
                self._keep_alive = False  # bytes nobody asked for: this connection is not reused
                self.abort()
                return
            if self._buffer:  # the head came in pieces: parsed again once its end may be there
                self._buffer += data
                if b"\n\r\n" not in self._buffer and b"\n\n" not in self._buffer:
                    self._fail_if_head_too_large(len(self._buffer))
                    return
                data = bytes(self._buffer)
                self._buffer.clear()
            rest = self._take_head(data)
            if not rest:  # the head is incomplete (kept), failed, or all there was
                return
            data = rest
        response = self._response
        assert response is not None
        response.feed(data)

    def eof_received(self) -> bool | None:
        if self._response is not None:
            self._response.end_of_stream()
        return None  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        if self._closed or self._transport is None:  # never made: the pool counted it back already
            return
        self._closed = True
        self._cancel_timer()
        error = exc or ConnectionResetError("the upstream closed the connection")
        if self._head_waiter is not None and not self._head_waiter.done():
            failure = error if isinstance(error, OSError) else ConnectionResetError(str(error))
            self._head_waiter.set_exception(failure)
        if self._response is not None:
            self._response.end_of_stream(error)
        self._pool.forget(self)

    def pause_writing(self) -> None:  # requests are small: nothing to hold back
        pass

    def resume_writing(self) -> None:
        pass

    # -- used by the pool and the response

    def reusable(self) -> bool:
        return (
            not self._closed
            and self._keep_alive
            and self._transport is not None
            and not self._transport.is_closing()
            and time.monotonic() - self.idle_since < KEEPALIVE_SECONDS
        )

    async def send(self, request: bytes, method: str, read_timeout: float) -> UpstreamResponse:
        if self._closed or self._transport is None or self._transport.is_closing():
            raise UpstreamConnectError("the connection closed before the request was sent")
        self._method = method
        self._read_timeout = read_timeout
        self._response = None
        self._head_waiter = self._loop.create_future()
        self._touch()
        self._transport.write(request)
        return await self._head_waiter

    def allow_silence(self, seconds: float) -> None:
        """The longest silence allowed from now until the answer is read (send's read_timeout)."""
        self._read_timeout = seconds
        self._touch()

    def abort(self) -> None:
        self._keep_alive = False
        if self._transport is not None and not self._closed:
            self._transport.abort()

    def done(self, response: UpstreamResponse) -> None:
        """Its answer was read to its end."""
        if response is not self._response:
            return
        self._response = None
        self._head_waiter = None
        if self._paused and self._transport is not None:
            self._transport.resume_reading()
            self._paused = False
        self._pool.release(self)

    def pause(self, paused: bool) -> None:
        if self._transport is None or self._closed or paused == self._paused:
            return
        self._paused = paused
        if paused:  # its silence is ours, not the upstream's: no read timeout meanwhile
            self._transport.pause_reading()
            self._cancel_timer()
        else:
            self._transport.resume_reading()
            self._touch()

    # -- internals

    def _take_head(self, data: bytes) -> bytes | None:
        """The answer's head, read from the start of `data` once whole (the Rust core parses it):
        the response is made and handed to the sender, and the bytes after the head returned. 1xx
        heads (103 Early Hints) are skipped. None while it is incomplete (`data` is kept for the
        next read) or when it failed."""
        while True:
            try:
                head = parse_response_head(data)
            except InvalidHttpError as exc:
                self._fail(UpstreamProtocolError(str(exc)))
                return None
            if head is None:  # incomplete: kept unless it is past the limit already
                if not self._fail_if_head_too_large(len(data)):
                    self._buffer += data
                return None
            if self._fail_if_head_too_large(head[3]):
                return None
            http11, status, pairs, length = head
            data = data[length:]
            if not 100 <= status < 200:
                break
        headers = CIMultiDict(pairs)
        self._keep_alive = http11 and "close" not in headers.get("connection", "").lower()
        response = UpstreamResponse(self, status, CIMultiDictProxy(headers), self._framing(status, headers))
        self._response = response
        waiter, self._head_waiter = self._head_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(response)
        response.begin()
        return data

    def _fail_if_head_too_large(self, size: int) -> bool:
        """Fail the answer when `size` bytes of its head (whole or not yet) pass MAX_HEAD_BYTES."""
        if size <= MAX_HEAD_BYTES:
            return False
        self._fail(UpstreamProtocolError("the upstream's answer head is too large"))
        return True

    def _framing(self, status: int, headers: CIMultiDict[str]) -> _Framing:
        if self._method == "HEAD" or status in (204, 304):
            return _Framing(length=0)
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return _Framing(chunked=True)
        declared = headers.get("content-length")
        if declared is not None:
            if not declared.strip().isdigit():
                self._keep_alive = False
                return _Framing()
            return _Framing(length=int(declared))
        self._keep_alive = False  # the body ends where the connection does
        return _Framing()

    def _fail(self, exc: Exception) -> None:
        self._keep_alive = False
        waiter, self._head_waiter = self._head_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        if self._response is not None:
            self._response.end_of_stream(exc)
        if self._transport is not None:
            self._transport.abort()

    def _touch(self) -> None:
        """(Re)start the read timeout: the longest silence allowed until the answer is read. One
        timer stays armed while bytes keep coming: a read only notes its time, and the timer, when
        it fires before the silence is long enough, waits for the rest (a timer made and cancelled
        per read cost more than the read, on every chunk of a stream). Nor is it cancelled when an
        answer ends (`done`): the connection's next request, usually soon, finds it armed; only a
        timer due later than the new request's deadline is made anew."""
        if self._read_timeout <= 0:
            self._cancel_timer()
            return
        loop = self._loop
        self._last_read = loop.time()
        due = self._last_read + self._read_timeout
        if self._timer is None or self._timer_due > due:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = loop.call_at(due, self._timed_out)
            self._timer_due = due

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _timed_out(self) -> None:
        self._timer = None
        if self._head_waiter is None and self._response is None:
            return  # idle between requests: the next one arms it again
        loop = self._loop
        due = self._last_read + self._read_timeout
        if loop.time() < due:  # bytes came since the timer was set: the silence is shorter
            self._timer = loop.call_at(due, self._timed_out)
            self._timer_due = due
            return
        self._fail(ReadTimeout(f"the upstream sent nothing for {self._read_timeout:g} s"))


class _Framing:
    """How an answer's body ends: after `length` bytes, with the last chunk of a chunked body, or
    with the connection (neither given)."""

    __slots__ = ("chunk_left", "chunked", "length", "state")

    def __init__(self, length: int | None = None, chunked: bool = False) -> None:
        self.length = length
        self.chunked = chunked
        self.state = "size"  # chunked: size line, data, the CRLF after the data, trailers
        self.chunk_left = 0


class UpstreamResponse:
    """An upstream's answer: its status and headers at once, its body as it comes (`iter_any`,
    or `read` for all of it). `release()` gives the connection back when the body was read to its
    end, and closes it otherwise; `close()` closes it."""

    def __init__(
        self, connection: _Connection, status: int, headers: CIMultiDictProxy[str], framing: _Framing
    ) -> None:
        self.status = status
        self.headers = headers
        self._connection: _Connection | None = connection
        self._loop = connection._loop  # its reads wait on it, once a chunk (see _Connection._loop)
        self._framing = framing
        self._parts: deque[bytes] = deque()
        self._buffered = 0
        self._pending = bytearray()  # chunked: what could not be decoded yet
        self._eof = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    def allow_silence(self, seconds: float) -> None:
        """The longest silence allowed between reads of the rest of the body (the request's
        read_timeout until now: one for its head, another for its body)."""
        if self._connection is not None:
            self._connection.allow_silence(seconds)

    @property
    def content(self) -> UpstreamResponse:
        """`response.content.iter_any()`, as callers of aiohttp's wrote it. A property, not an
        attribute: `self.content = self` made every answer a reference cycle, left to the garbage
        collector (five objects a request, a 3-5 ms young collection every 1.5 s at c=1)."""
        return self

    # -- fed by the connection

    def begin(self) -> None:
        """The head is read: a body of no bytes is complete at once."""
        if self._framing.length == 0:
            self._finish()

    def feed(self, data: bytes) -> None:
        if self._eof:
            return
        framing = self._framing
        if framing.chunked:
            self._pending += data
            self._decode_chunks()
        elif framing.length is not None:
            take = data[: framing.length]
            framing.length -= len(take)
            if len(take) < len(data) and self._connection is not None:
                self._connection.abort()  # more than it declared: the connection cannot be trusted
            self._push(take)
            if framing.length == 0:
                self._finish()
        else:
            self._push(data)

    def end_of_stream(self, error: BaseException | None = None) -> None:
        """The connection ended: a body framed by it is complete; any other is cut short."""
        if self._eof:
            return
        framing = self._framing
        if framing.length is None and not framing.chunked and error is None:
            self._finish()
            return
        self._error = (
            error
            if isinstance(error, OSError | TimeoutError)
            else ConnectionResetError("the upstream's answer broke off")
        )
        self._eof = True
        self._connection = None
        self._wake()

    def _decode_chunks(self) -> None:
        framing = self._framing
        pending = self._pending
        while pending and not self._eof:
            if framing.state == "size":
                end = pending.find(b"\r\n")
                if end < 0:
                    if len(pending) > 4096:
                        self._broken("a chunk size line is too long")
                    return
                size = bytes(pending[:end]).split(b";", 1)[0].strip()
                del pending[: end + 2]
                try:
                    framing.chunk_left = int(size, 16)
                except ValueError:
                    self._broken("a chunk size is not hexadecimal")
                    return
                framing.state = "data" if framing.chunk_left else "trailer"
            elif framing.state == "data":
                take = bytes(pending[: framing.chunk_left])
                del pending[: len(take)]
                framing.chunk_left -= len(take)
                self._push(take)
                if framing.chunk_left == 0:
                    framing.state = "crlf"
            elif framing.state == "crlf":
                if len(pending) < 2:
                    return
                if pending[:2] != b"\r\n":
                    self._broken("a chunk does not end with CRLF")
                    return
                del pending[:2]
                framing.state = "size"
            else:  # trailer lines, up to an empty one
                end = pending.find(b"\r\n")
                if end < 0:
                    return
                line = pending[:end]
                del pending[: end + 2]
                if not line:
                    self._finish()

    def _broken(self, why: str) -> None:
        connection = self._connection
        self.end_of_stream(UpstreamProtocolError(why))
        if connection is not None:
            connection.abort()

    def _push(self, data: bytes) -> None:
        if not data:
            return
        self._parts.append(data)
        self._buffered += len(data)
        if self._buffered > PAUSE_BYTES and self._connection is not None:
            self._connection.pause(True)
        self._wake()

    def _finish(self) -> None:
        self._eof = True
        connection, self._connection = self._connection, None
        self._wake()
        if connection is not None:
            connection.done(self)

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- read by the caller

    async def iter_any(self) -> AsyncIterator[bytes]:
        """The body in the pieces it arrives in (several joined when they wait together, up to
        READ_PIECE_BYTES)."""
        while True:
            chunk = await self._next()
            if not chunk:
                return
            yield chunk

    async def read(self) -> bytes:
        parts: list[bytes] = []
        while chunk := await self._next(whole=True):
            parts.append(chunk)
        return b"".join(parts)

    async def _next(self, whole: bool = False) -> bytes:
        """What waits, joined; at most READ_PIECE_BYTES of it unless `whole` (read(): the body is
        joined anyway)."""
        while not self._parts:
            if self._eof:
                if self._error is not None:
                    raise self._error
                return b""
            self._waiter = self._loop.create_future()
            await self._waiter
        if self._buffered > READ_PIECE_BYTES and not whole:
            chunk = self._piece()
        else:
            chunk = self._parts.popleft() if len(self._parts) == 1 else b"".join(self._parts)
            self._parts.clear()
            self._buffered = 0
        if self._connection is not None and self._buffered < RESUME_BYTES:
            self._connection.pause(False)
        return chunk

    def _piece(self) -> bytes:
        """READ_PIECE_BYTES from the start of what waits (a backlog goes on in pieces)."""
        taken: list[bytes] = []
        room = READ_PIECE_BYTES
        parts = self._parts
        while room > 0 and parts:
            part = parts.popleft()
            if len(part) > room:
                parts.appendleft(part[room:])
                part = part[:room]
            taken.append(part)
            room -= len(part)
        self._buffered -= READ_PIECE_BYTES - room
        return taken[0] if len(taken) == 1 else b"".join(taken)

    def release(self) -> None:
        """Done with it: a body read to its end left its connection in the pool already; one that
        was not closes its connection (the rest of it is never read)."""
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.abort()
        self._eof = True
        self._parts.clear()

    def close(self) -> None:
        """Abort it now, however far it was read (the drain deadline: routes/streaming.py)."""
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.abort()
        if not self._eof:
            self._error = ConnectionResetError("the answer was closed by the gateway")
            self._eof = True
            self._wake()

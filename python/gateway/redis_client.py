"""The one way the gateway talks to Redis: `connect(url)` gives a process its client.

Each worker process makes one (in the application's lifespan) and closes it at shutdown; every
part that keeps shared state in Redis (rate-limit buckets, channel state) takes that client rather
than opening its own.

One connection per process carries every call (Redis answers in order, so replies are matched to
calls first in, first out), and the calls made in one turn of the event loop go out in one write:
under load, one system call sends the bucket operations of many requests, and one read takes their
answers. A bucket operation at c=64 costs the process about a fifth of the CPU it did through
redis-py's pooled asyncio client, which also cost each process about 7 MB (benches/README.md).

Calls fail fast: a Redis that is down or unreachable must not hold requests. A connection is given
SOCKET_TIMEOUT to open, and while calls wait, Redis must send a reply at least every SOCKET_TIMEOUT
(one timer per silence, not one per call), else every waiting call fails with RedisTimeout and the
connection is dropped. A call whose connection broke is tried once more, at once, on a fresh
connection (a connection broken by a Redis restart is only noticed on its next use); a call that
timed out is not (it may have run: a script must not run twice). Then its error is raised (see
`UNAVAILABLE`). Nothing needs restarting when Redis comes back: the next call connects again.
"""

from __future__ import annotations

import asyncio
import hashlib
import ssl
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, cast
from urllib.parse import parse_qs, unquote, urlsplit

from .loop_failures import outcome_taken
from .redis_protocol import ProtocolError, Reply, ReplyError, ReplyParser, encode_command

# Seconds to connect, and the longest silence while calls wait for replies: a Redis on the same
# network answers in well under a millisecond, so half a second means it is gone (or stalled).
SOCKET_TIMEOUT: Final = 0.5
DEFAULT_PORT: Final = 6379


class RedisUnavailable(Exception):
    """Redis cannot be used right now: unreachable, gone mid-call, silent, loading its data, or a
    replica after a failover (as opposed to a mistake of the caller's, a ReplyError)."""


class RedisConnectionError(RedisUnavailable, ConnectionError):
    """The connection could not be made, or broke (the call may be tried again on a new one)."""


class RedisTimeout(RedisUnavailable, TimeoutError):
    """Redis went silent with calls waiting: they may have run, so they are not tried again."""


class UnavailableReply(ReplyError, RedisUnavailable):
    """An error reply that says Redis cannot serve now rather than that the call was wrong."""


class NoScript(ReplyError):
    """EVALSHA of a script Redis does not have (restarted, or SCRIPT FLUSH): it is sent whole."""


# The error codes that mean "not now": a replica (READONLY, after a failover), data still loading,
# a replica cut off from its primary, a busy script, a cluster mid-change.
_UNAVAILABLE_CODES: Final = frozenset(
    {"READONLY", "LOADING", "MASTERDOWN", "BUSY", "CLUSTERDOWN", "TRYAGAIN"}
)

# The errors that mean "Redis cannot be used right now": callers turn these into their documented
# fault behaviour (a 503, or a per-process fallback).
UNAVAILABLE: Final = (RedisUnavailable, OSError, TimeoutError)


def _raised(error: ReplyError) -> ReplyError:
    if error.code == "NOSCRIPT":
        return NoScript(error.line)
    if error.code in _UNAVAILABLE_CODES:
        return UnavailableReply(error.line)
    return error


@dataclass(frozen=True, slots=True)
class RedisAddress:
    """Where Redis is and how to log in, from a redis://, rediss:// or unix:// URL."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    path: str | None = None  # a Unix socket instead of host and port
    db: int = 0
    username: str | None = None
    password: str | None = None
    tls: ssl.SSLContext | None = None

    @property
    def where(self) -> str:
        """The address without its credentials, for messages."""
        return self.path if self.path is not None else f"{self.host}:{self.port}"


_TLS_PARAMS: Final = ("ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_check_hostname")


def parse_url(url: str) -> RedisAddress:
    """`redis://[[user]:password@]host[:port][/db]`, the same with `rediss://` (TLS; options
    `ssl_cert_reqs` none/optional/required, `ssl_ca_certs`, `ssl_certfile`, `ssl_keyfile`,
    `ssl_check_hostname` true/false), or `unix://[[user]:password@]/path`; `?db=N` in each.
    ValueError, never quoting the URL (it may hold a password), for anything else."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ValueError("a Redis URL starts with redis://, rediss:// or unix://")
    query = {name: values[-1] for name, values in parse_qs(parts.query, keep_blank_values=True).items()}
    allowed = {"db", *(_TLS_PARAMS if parts.scheme == "rediss" else ())}
    unknown = sorted(set(query) - allowed)
    if unknown:
        raise ValueError(
            f"a Redis URL takes no parameter {unknown[0]!r} (it takes {', '.join(sorted(allowed))})"
        )
    db_text = query.get("db")
    if db_text is None and parts.scheme != "unix" and parts.path not in ("", "/"):
        db_text = parts.path.lstrip("/")
    db = _whole(db_text, "database number") if db_text is not None else 0
    username = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password is not None else None
    if parts.scheme == "unix":
        if not parts.path:
            raise ValueError("a unix:// Redis URL needs the socket's path")
        return RedisAddress(path=unquote(parts.path), db=db, username=username, password=password)
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError:
        raise ValueError("a Redis URL's port must be a number from 1 to 65535") from None
    host = parts.hostname or "127.0.0.1"
    tls = _tls(query, host) if parts.scheme == "rediss" else None
    return RedisAddress(host=host, port=port, db=db, username=username, password=password, tls=tls)


def _whole(text: str, what: str) -> int:
    if not text.isdigit() or not text.isascii():
        raise ValueError(f"a Redis URL's {what} must be a whole number")
    return int(text)


def _tls(query: dict[str, str], host: str) -> ssl.SSLContext:
    reqs = query.get("ssl_cert_reqs", "required").lower()
    modes = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}
    if reqs not in modes:
        raise ValueError("a Redis URL's ssl_cert_reqs is none, optional or required")
    check = query.get("ssl_check_hostname", "true" if reqs == "required" else "false").lower()
    if check not in ("true", "false"):
        raise ValueError("a Redis URL's ssl_check_hostname is true or false")
    try:
        context = ssl.create_default_context(cafile=query.get("ssl_ca_certs") or None)
        context.check_hostname = check == "true"
        context.verify_mode = modes[reqs]
        if query.get("ssl_certfile"):
            context.load_cert_chain(query["ssl_certfile"], query.get("ssl_keyfile") or None)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"a Redis URL's TLS certificates cannot be loaded: {exc}") from None
    return context


class _Lost(RedisConnectionError):
    """The connection broke with the call on it: it is tried once more on a fresh one."""


class _Connection(asyncio.Protocol):
    """One connection: calls written together once per turn of the loop, replies matched to them
    in order."""

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout: float, where: str) -> None:
        self.loop = loop
        self.broken = False
        self._timeout = timeout
        self._where = where
        self._transport: asyncio.Transport | None = None
        self._parser = ReplyParser()
        self._waiting: deque[asyncio.Future[Reply]] = deque()
        self._out: list[bytes] = []
        self._flush: asyncio.Handle | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._progress = 0.0  # when Redis last sent something (or the first waiting call went out)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def call(self, command: bytes) -> asyncio.Future[Reply]:
        reply: asyncio.Future[Reply] = self.loop.create_future()
        if self.broken:
            reply.set_exception(_Lost(f"the connection to Redis at {self._where} broke"))
            return reply
        if not self._waiting:
            self._progress = self.loop.time()
            if self._timer is None:
                self._timer = self.loop.call_at(self._progress + self._timeout, self._check_silence)
        self._waiting.append(reply)
        self._out.append(command)
        if self._flush is None:
            self._flush = self.loop.call_soon(self._write)
        return reply

    def _write(self) -> None:
        self._flush = None
        if self.broken or self._transport is None or not self._out:
            return
        data = self._out[0] if len(self._out) == 1 else b"".join(self._out)
        self._out.clear()
        self._transport.write(data)

    def data_received(self, data: bytes) -> None:
        self._progress = self.loop.time()  # a long reply still coming is not a silence
        try:
            replies = self._parser.feed(data)
        except ProtocolError as exc:
            why = f"Redis at {self._where} sent what is not a reply: {exc}"
            self._fail(lambda: RedisUnavailable(why))
            return
        waiting = self._waiting
        for reply in replies:
            if not waiting:
                self._fail(lambda: RedisUnavailable(f"Redis at {self._where} sent a reply nobody asked for"))
                return
            pending = waiting.popleft()
            if pending.done():  # its caller gave up (cancelled): the reply is dropped
                continue
            if isinstance(reply, ReplyError):
                pending.set_exception(_raised(reply))
            else:
                pending.set_result(reply)

    def _check_silence(self) -> None:
        self._timer = None
        if self.broken or not self._waiting:
            return
        due = self._progress + self._timeout
        if self.loop.time() < due:
            self._timer = self.loop.call_at(due, self._check_silence)
            return
        self._fail(lambda: RedisTimeout(f"Redis at {self._where} did not answer within {self._timeout:g} s"))

    def connection_lost(self, exc: Exception | None) -> None:
        why = f": {exc}" if exc is not None else ""
        self._fail(lambda: _Lost(f"the connection to Redis at {self._where} broke{why}"))

    def close(self) -> None:
        self._fail(lambda: RedisConnectionError("the Redis client was closed"))

    def _fail(self, error: Any) -> None:
        """Every waiting call fails with a new `error()`, and the connection is dropped."""
        self.broken = True
        for handle in (self._timer, self._flush):
            if handle is not None:
                handle.cancel()
        self._timer = self._flush = None
        self._out.clear()
        while self._waiting:
            pending = self._waiting.popleft()
            if not pending.done():
                pending.set_exception(error())
        if self._transport is not None and not self._transport.is_closing():
            self._transport.abort()


class RedisClient:
    """A process's client of one Redis (`connect`). No I/O happens until the first call."""

    def __init__(self, address: RedisAddress, timeout: float = SOCKET_TIMEOUT) -> None:
        self.address = address
        self._timeout = timeout
        self._connection: _Connection | None = None
        self._opening: asyncio.Future[_Connection] | None = None

    async def execute(self, *args: bytes | str | int | float) -> Any:
        """One command's reply (a gateway.redis_protocol.Reply, its shape the command's); an error
        reply raises (ReplyError; UnavailableReply, NoScript)."""
        command = encode_command(args)
        try:
            return await (await self._open()).call(command)
        except _Lost:  # tried once more, on a fresh connection
            pass
        try:
            return await (await self._open()).call(command)
        except _Lost as exc:
            raise RedisConnectionError(str(exc)) from None

    async def ping(self) -> bool:
        pong: bytes = await self.execute("PING")
        return pong == b"PONG"

    def register_script(self, source: str) -> Script:
        return Script(self, source)

    async def aclose(self) -> None:
        """Drops the connection, failing the calls still waiting; a later call connects again."""
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()

    async def _open(self) -> _Connection:
        connection = self._connection
        loop = asyncio.get_running_loop()
        if connection is not None and not connection.broken and connection.loop is loop:
            return connection
        opening = self._opening
        if opening is None or opening.done() or opening.get_loop() is not loop:
            # One connection made for every call that needs it meanwhile; a caller that gives up
            # does not stop it for the others.
            opening = self._opening = asyncio.ensure_future(self._connect(loop))
            # Its failure is raised to every caller still waiting; with none left, taken here.
            opening.add_done_callback(outcome_taken)
        return await asyncio.shield(opening)

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> _Connection:
        address = self.address
        connection = _Connection(loop, self._timeout, address.where)
        try:
            async with asyncio.timeout(self._timeout):
                if address.path is not None:
                    await loop.create_unix_connection(lambda: connection, address.path)
                else:
                    await loop.create_connection(
                        lambda: connection,
                        address.host,
                        address.port,
                        ssl=address.tls,
                        server_hostname=address.host if address.tls is not None else None,
                    )
                await self._log_in(connection)
        except TimeoutError:
            connection.close()
            raise RedisTimeout(
                f"Redis at {address.where} did not accept a connection within {self._timeout:g} s"
            ) from None
        except (OSError, ssl.SSLError) as exc:
            connection.close()
            raise RedisConnectionError(f"cannot connect to Redis at {address.where}: {exc}") from None
        except ReplyError as exc:
            connection.close()
            if isinstance(exc, RedisUnavailable):
                raise
            # A refused password or database is Redis refusing this gateway, as when it is away.
            raise RedisConnectionError(f"Redis at {address.where} refused the connection: {exc}") from None
        self._connection = connection
        return connection

    async def _log_in(self, connection: _Connection) -> None:
        address = self.address
        steps: list[Sequence[bytes | str | int]] = []
        if address.password is not None:
            steps.append(
                ("AUTH", address.password)
                if address.username is None
                else ("AUTH", address.username, address.password)
            )
        if address.db:
            steps.append(("SELECT", address.db))
        for reply in [connection.call(encode_command(step)) for step in steps]:
            await reply


class Script:
    """A Lua script run by EVALSHA, and sent whole (EVAL) when Redis does not have it."""

    __slots__ = ("_client", "_source", "sha")

    def __init__(self, client: RedisClient, source: str) -> None:
        self._client = client
        self._source = source.encode()
        self.sha = hashlib.sha1(self._source).hexdigest()

    async def __call__(
        self, keys: Sequence[bytes | str] = (), args: Sequence[bytes | str | int | float] = ()
    ) -> Any:
        try:
            return await self._client.execute("EVALSHA", self.sha, len(keys), *keys, *args)
        except NoScript:
            return await self._client.execute("EVAL", self._source, len(keys), *keys, *args)


def connect(url: str, timeout: float = SOCKET_TIMEOUT) -> RedisClient:
    """A client for `url` (redis://, rediss:// or unix://, as in the [redis] section; ValueError
    for one that is not). No I/O happens here. Close it with `await client.aclose()`."""
    return RedisClient(parse_url(url), timeout)

"""The gateway's own Redis client (gateway.redis_client, gateway.redis_protocol): RESP2 parsed from
any split of the bytes, bad bytes refused; calls multiplexed on one connection get their own replies;
its faults as documented (a broken connection tried once more, a silence not, READONLY unavailable,
a forgotten script sent whole); its URLs. Against the real Redis, and small servers of the test's
own for what a healthy Redis never does."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import redis as redis_py
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.redis_client import (
    UNAVAILABLE,
    RedisClient,
    RedisConnectionError,
    RedisTimeout,
    UnavailableReply,
    connect,
    parse_url,
)
from gateway.redis_protocol import ProtocolError, Reply, ReplyError, ReplyParser, encode_command

# ---------------------------------------------------------------------------- the protocol


def _encode_reply(reply: Reply) -> bytes:
    if reply is None:
        return b"$-1\r\n"
    if isinstance(reply, ReplyError):
        return b"-%s\r\n" % reply.line.encode()
    if isinstance(reply, int):
        return b":%d\r\n" % reply
    if isinstance(reply, bytes):
        return b"$%d\r\n%s\r\n" % (len(reply), reply)
    return b"*%d\r\n%s" % (len(reply), b"".join(_encode_reply(item) for item in reply))


def _plain(reply: Reply) -> Any:
    """A reply comparable with ==: an error as its line."""
    if isinstance(reply, ReplyError):
        return ("error", reply.line)
    if isinstance(reply, list):
        return [_plain(item) for item in reply]
    return reply


_errors = st.from_regex(r"\A[A-Z]{2,10} [ -~]{0,30}\Z").map(ReplyError)
_replies: st.SearchStrategy[Reply] = st.recursive(
    st.none() | st.integers(-(2**63), 2**63 - 1) | st.binary(max_size=40) | _errors,
    lambda inner: st.lists(inner, max_size=5),
    max_leaves=20,
)


@settings(max_examples=300)
@given(replies=st.lists(_replies, min_size=1, max_size=6), cuts=st.lists(st.integers(0, 2000), max_size=8))
def test_replies_parse_back_from_any_split_of_their_bytes(replies: list[Reply], cuts: list[int]) -> None:
    data = b"".join(_encode_reply(r) for r in replies)
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    parser = ReplyParser()
    got: list[Reply] = []
    for start, stop in itertools.pairwise(bounds):
        got.extend(parser.feed(data[start:stop]))
    assert [_plain(r) for r in got] == [_plain(r) for r in replies]
    assert parser.pending == 0


def test_simple_strings_and_nil_arrays() -> None:
    assert ReplyParser().feed(b"+OK\r\n*-1\r\n*0\r\n$0\r\n\r\n") == [b"OK", None, [], b""]


@settings(max_examples=500)
@given(data=st.binary(max_size=200))
def test_any_bytes_give_replies_a_protocol_error_or_a_wait(data: bytes) -> None:
    """Whatever arrives, the parser answers with replies, ProtocolError, or waits for more: never
    another exception, never a hang."""
    with contextlib.suppress(ProtocolError):
        ReplyParser().feed(data)


@pytest.mark.parametrize(
    "data",
    [
        b"?what\r\n",
        b"$3\r\nabcd\r\n",
        b":12a\r\n",
        b"$-2\r\n",
        b"*-3\r\n",
        b":\r\n",
        b"*1\r\n" * 40 + b":1\r\n",
        b"+" + b"x" * (70 * 1024),
    ],
)
def test_what_is_not_resp2_is_refused(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        ReplyParser().feed(data)


def test_commands_are_arrays_of_bulk_strings() -> None:
    assert encode_command(["SET", b"k\r\n", 12, 1.5]) == (
        b"*4\r\n$3\r\nSET\r\n$3\r\nk\r\n\r\n$2\r\n12\r\n$3\r\n1.5\r\n"
    )
    with pytest.raises(TypeError):
        encode_command(["SET", True])  # a bool is not a number to Redis


# ---------------------------------------------------------------------------- the real Redis


def with_client(url: str, work: Callable[[RedisClient], Awaitable[None]]) -> None:
    """`work` done with a client of `url` in an event loop of its own, the client closed after."""

    async def go() -> None:
        client = connect(url)
        try:
            await work(client)
        finally:
            await client.aclose()

    asyncio.run(go())


def test_concurrent_calls_on_one_connection_get_their_own_replies(redis_url: str) -> None:
    values = [uuid.uuid4().hex.encode() * (i % 7 + 1) for i in range(300)]

    async def work(client: RedisClient) -> None:
        echoed = await asyncio.gather(*(client.execute("ECHO", v) for v in values))
        assert echoed == values
        assert await client.ping()

    with_client(redis_url, work)


@settings(max_examples=40, deadline=None)
@given(
    value=st.binary(max_size=300) | st.text(max_size=100).map(lambda t: t.encode("utf-8", "surrogatepass"))
)
def test_any_bytes_are_stored_and_read_back(redis_url: str, value: bytes) -> None:
    key = f"test:rc:{uuid.uuid4().hex}"

    async def work(client: RedisClient) -> None:
        assert await client.execute("SET", key, value, "PX", 10_000) == b"OK"
        assert await client.execute("GET", key) == value
        await client.execute("DEL", key)

    with_client(redis_url, work)


def test_a_forgotten_script_is_sent_whole(redis_url: str) -> None:
    async def work(client: RedisClient) -> None:
        script = client.register_script("return {KEYS[1], tonumber(ARGV[1]) + 1, false}")
        assert await script(keys=["k"], args=[41]) == [b"k", 42, None]  # Lua false: nil
        await client.execute("SCRIPT", "FLUSH")
        assert await script(keys=["k"], args=[1]) == [b"k", 2, None]

    with_client(redis_url, work)


def test_an_error_reply_is_raised_and_the_connection_goes_on(redis_url: str) -> None:
    async def work(client: RedisClient) -> None:
        with pytest.raises(ReplyError) as caught:
            await client.execute("NO-SUCH-COMMAND")
        assert caught.value.code == "ERR" and not isinstance(caught.value, UNAVAILABLE)
        assert await client.execute("ECHO", "after") == b"after"

    with_client(redis_url, work)


def test_the_database_in_the_url_is_selected(redis_url: str) -> None:
    base = redis_url.rsplit("/", 1)[0]
    key = f"test:rc:{uuid.uuid4().hex}"

    async def work(client: RedisClient) -> None:
        await client.execute("SET", key, "in 3", "PX", 10_000)

    with_client(base + "/3", work)
    check = redis_py.Redis.from_url(base + "/3")
    other = redis_py.Redis.from_url(base + "/0")
    try:
        assert check.get(key) == b"in 3" and other.get(key) is None
        check.delete(key)
    finally:
        check.close()
        other.close()


def test_a_refused_password_is_redis_unavailable_and_never_shown(redis_url: str) -> None:
    """A Redis without a password answers AUTH with an error: the connection is refused, as one
    with a wrong password is, and the message does not carry the password."""
    host = redis_url.split("://", 1)[1]

    async def go() -> None:
        client = connect(f"redis://:s3cret-pw@{host}")
        with pytest.raises(RedisConnectionError) as caught:
            await client.ping()
        assert isinstance(caught.value, UNAVAILABLE) and "s3cret-pw" not in str(caught.value)

    asyncio.run(go())


def test_an_unreachable_redis_fails_at_once() -> None:
    async def go() -> None:
        client = connect("redis://127.0.0.1:1/0")
        with pytest.raises(RedisConnectionError):
            await client.ping()

    asyncio.run(go())


# ---------------------------------------------------------------------------- scripted servers

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


@asynccontextmanager
async def server(handler: Handler) -> AsyncIterator[tuple[str, list[int]]]:
    """A server on a free port whose n-th connection (from 0) `handler` serves; yields its URL and
    the list of connections made so far."""
    made: list[int] = []
    serving: list[asyncio.Task[Any]] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        made.append(len(made))
        task = asyncio.current_task()
        assert task is not None
        serving.append(task)
        try:
            await handler(reader, writer, made[-1])
        finally:
            writer.close()
            await writer.wait_closed()

    listening = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = listening.sockets[0].getsockname()[1]
    try:
        yield f"redis://127.0.0.1:{port}/0", made
    finally:
        listening.close()
        # Each connection's handler ends once the client is gone (its read returns).
        if serving:
            await asyncio.wait(serving, timeout=2)


async def read_command(reader: asyncio.StreamReader) -> list[bytes]:
    count = int((await reader.readline())[1:])
    args = []
    for _ in range(count):
        size = int((await reader.readline())[1:])
        args.append((await reader.readexactly(size + 2))[:-2])
    return args


async def commands(reader: asyncio.StreamReader) -> AsyncIterator[list[bytes]]:
    """Each command the client sends, until it closes the connection."""
    while True:
        try:
            yield await read_command(reader)
        except (ValueError, asyncio.IncompleteReadError):
            return


def test_a_call_whose_connection_broke_is_tried_once_more_on_a_new_one() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        command = await read_command(reader)
        if n == 0:
            return  # closes with the call on it: Redis restarted
        writer.write(b"$%d\r\n%s\r\n" % (len(command[1]), command[1]))
        await writer.drain()
        await reader.read()

    async def go() -> None:
        async with server(handler) as (url, made):
            client = connect(url)
            assert await client.execute("ECHO", "again") == b"again"
            assert len(made) == 2
            await client.aclose()

    asyncio.run(go())


def test_twice_broken_is_raised() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_command(reader)

    async def go() -> None:
        async with server(handler) as (url, made):
            client = connect(url)
            with pytest.raises(RedisConnectionError):
                await client.execute("ECHO", "x")
            assert len(made) == 2

    asyncio.run(go())


def test_a_silent_redis_times_every_waiting_call_out_once_and_is_dropped() -> None:
    """Calls that may have run are not tried again; the next call connects afresh."""
    calls: list[list[bytes]] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        async for command in commands(reader):
            calls.append(command)
            if n > 0:
                writer.write(b"+PONG\r\n")
                await writer.drain()

    async def go() -> None:
        async with server(handler) as (url, made):
            client = connect(url, timeout=0.2)
            started = asyncio.get_running_loop().time()
            results = await asyncio.gather(
                *(client.execute("PING") for _ in range(5)), return_exceptions=True
            )
            assert all(isinstance(r, RedisTimeout) for r in results)
            assert 0.15 < asyncio.get_running_loop().time() - started < 1.0
            assert len(calls) == 5  # each sent once, none again
            assert await client.ping() and len(made) == 2
            await client.aclose()

    asyncio.run(go())


def test_a_busy_connection_waits_while_replies_keep_coming() -> None:
    """The timeout bounds a silence, not a call: calls queued behind slow ones still complete."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        for _ in range(6):
            command = await read_command(reader)
            await asyncio.sleep(0.1)
            writer.write(b"$%d\r\n%s\r\n" % (len(command[1]), command[1]))
            await writer.drain()
        await reader.read()

    async def go() -> None:
        async with server(handler) as (url, _made):
            client = connect(url, timeout=0.25)
            got = await asyncio.gather(*(client.execute("ECHO", str(i)) for i in range(6)))
            assert got == [str(i).encode() for i in range(6)]
            await client.aclose()

    asyncio.run(go())


def test_a_cancelled_call_leaves_its_reply_behind() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        async for command in commands(reader):
            if command[1] == b"slow":
                await asyncio.sleep(0.1)
            writer.write(b"$%d\r\n%s\r\n" % (len(command[1]), command[1]))
            await writer.drain()

    async def go() -> None:
        async with server(handler) as (url, made):
            client = connect(url)
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.03):
                    await client.execute("ECHO", "slow")
            assert await client.execute("ECHO", "next") == b"next"
            assert len(made) == 1
            await client.aclose()

    asyncio.run(go())


@pytest.mark.parametrize(
    ("reply", "unavailable"),
    [
        (b"-READONLY You can't write against a read only replica.\r\n", True),
        (b"-LOADING Redis is loading the dataset in memory\r\n", True),
        (b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n", False),
    ],
)
def test_error_replies_that_mean_not_now_are_unavailable(reply: bytes, unavailable: bool) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_command(reader)
        writer.write(reply)
        await writer.drain()
        await reader.read()

    async def go() -> None:
        async with server(handler) as (url, _made):
            client = connect(url)
            with pytest.raises(ReplyError) as caught:
                await client.execute("SET", "k", "v")
            assert isinstance(caught.value, UnavailableReply) is unavailable
            assert isinstance(caught.value, UNAVAILABLE) is unavailable
            await client.aclose()

    asyncio.run(go())


def test_garbage_from_the_server_fails_the_calls_and_drops_the_connection() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_command(reader)
        writer.write(b"HTTP/1.1 400 Bad Request\r\n\r\n" if n == 0 else b"+PONG\r\n")
        await writer.drain()
        await reader.read()

    async def go() -> None:
        async with server(handler) as (url, made):
            client = connect(url)
            with pytest.raises(UNAVAILABLE):
                await client.execute("PING")
            assert await client.ping() and len(made) == 2
            await client.aclose()

    asyncio.run(go())


def test_a_unix_socket(tmp_path: Path) -> None:
    path = tmp_path / "redis.sock"

    async def go() -> None:
        served = asyncio.get_running_loop().create_future()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                assert await read_command(reader) == [b"SELECT", b"2"]
                writer.write(b"+OK\r\n")
                assert await read_command(reader) == [b"PING"]
                writer.write(b"+PONG\r\n")
                await writer.drain()
                await reader.read()
            finally:
                writer.close()
                await writer.wait_closed()
                served.set_result(None)

        listening = await asyncio.start_unix_server(serve, str(path))
        try:
            client = connect(f"unix://{path}?db=2")
            assert await client.ping()
            await client.aclose()
            await asyncio.wait_for(served, 2)
        finally:
            listening.close()

    asyncio.run(go())


# ---------------------------------------------------------------------------- URLs


def test_urls() -> None:
    a = parse_url("redis://user:p%40ss@redis.internal:6380/4")
    assert (a.host, a.port, a.db, a.username, a.password, a.tls) == (
        "redis.internal",
        6380,
        4,
        "user",
        "p@ss",
        None,
    )
    assert (
        parse_url("redis://:pw@[::1]/0").host == "::1" and parse_url("redis://:pw@[::1]/0").password == "pw"
    )
    b = parse_url("redis://127.0.0.1")
    assert (b.port, b.db, b.username, b.password) == (6379, 0, None, None)
    assert parse_url("redis://h/1?db=2").db == 2
    assert parse_url("unix:///run/redis.sock?db=5").path == "/run/redis.sock"
    tls = parse_url("rediss://h:6390/0?ssl_cert_reqs=none").tls
    assert tls is not None and not tls.check_hostname
    assert parse_url("rediss://h/0").tls is not None


@pytest.mark.parametrize(
    "url",
    [
        "http://h/0",
        "redis://:secret@h/x",
        "redis://:secret@h:99999/0",
        "redis://:secret@h/0?socket_timeout=1",
        "redis://:secret@h/0?ssl_cert_reqs=none",
        "rediss://:secret@h/0?ssl_cert_reqs=maybe",
        "unix://:secret@",
    ],
)
def test_a_wrong_url_is_refused_without_showing_it(url: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_url(url)
    assert "secret" not in str(caught.value)


def test_a_gateway_with_redis_loads_no_redis_py() -> None:
    """redis-py (a test dependency only) cost each process about 7 MB; the gateway, its Redis
    client, and everything that uses it (the readiness check included) load none of it."""
    code = (
        "import sys, gateway.app, gateway.redis_buckets, gateway.shared_channels;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'redis'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"

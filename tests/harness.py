"""Real processes for tests: the simulator and the gateway under Granian, on free loopback ports,
on either store backend: an SQLite file, or a fresh PostgreSQL database with Redis."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx
import orjson

from gateway.auth import display_prefix, generate_key, hash_key
from gateway.config import Settings, load_settings
from gateway.store import KeyContext, Store, TopUp, open_store

T = TypeVar("T")

# The services of the scaled-out set-up (issue 14), as they run here and in CI: PostgreSQL with trust
# auth and a database `test` (each gateway gets a database of its own, made from there) and Redis.
POSTGRES_URL = os.environ.get("GATEWAY_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("GATEWAY_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
BACKENDS = ("sqlite", "postgres")
# Columns that hold money: a query returns them as Decimal on either backend (SQLite keeps decimal
# text, PostgreSQL numeric).
MONEY_COLUMNS = frozenset({"balance", "balance_after", "amount", "cost", "hold", "credit_limit", "spent"})


def read_json_answer(sock: socket.socket, answer: bytes = b"") -> bytes:
    """What a raw socket reads of an HTTP answer with a JSON body (after `answer`, read already):
    until the body's closing brace, or the connection's end."""
    while not answer.rstrip().endswith(b"}"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        answer += chunk
    return answer


# Under pytest-xdist each worker takes its ports from a range of its own, below the kernel's
# ephemeral ports (32768 and up here): a port one worker found free and has not yet started its
# process on is never the one another worker, or an outgoing connection, is handed.
_PORT_RANGE = 1500
_next_port = itertools.count()


@contextmanager
def bare_upstream(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """A bare HTTP server answering as `handler` says, on a free port of this machine, for an
    upstream the simulator does not play (one that leaves out usage, one that echoes headers): its
    base URL, for as long as the block runs."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def send_json(handler: BaseHTTPRequestHandler, status: int, payload: object) -> None:
    """A bare upstream's JSON answer, whole, with its length."""
    body = orjson.dumps(payload)
    handler.send_response(status)
    handler.send_header("content-type", "application/json")
    handler.send_header("content-length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def free_port() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    first = 20000 + int(worker[2:]) * _PORT_RANGE
    for _ in range(_PORT_RANGE):
        port = first + next(_next_port) % _PORT_RANGE
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use, or a recent connection's TIME_WAIT
            return port
    raise RuntimeError(f"no free port in {first}..{first + _PORT_RANGE - 1}")


# ------------------------------------------------------------------ waiting for something to happen


class NeverHappened(AssertionError):
    """What `eventually` raises when what it waits for has not happened in time."""


def eventually(
    check: Callable[[], T | None],
    seconds: float = 5.0,
    step: float = 0.02,
    what: str | Callable[[], str] = "the condition",
) -> T:
    """The first truthy result of `check`, called at once and then every `step` seconds until
    `seconds` have passed (and once more then); NeverHappened naming `what` (a text, or a function
    that writes one from what it sees at the end) if none came. The way to wait for something that
    happens moments later (a record written, a state reached, a process up): it returns as soon as
    it has. Not for showing that something does not happen: that takes a fixed wait."""
    deadline = time.monotonic() + seconds
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise NeverHappened(_not_in_time(what, seconds, result))
        time.sleep(step)


async def eventually_async(
    check: Callable[[], Awaitable[T | None]],
    seconds: float = 5.0,
    step: float = 0.02,
    what: str | Callable[[], str] = "the condition",
) -> T:
    """`eventually` in a coroutine, for a check that is one: the loop runs on while it waits."""
    deadline = time.monotonic() + seconds
    while True:
        result = await check()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise NeverHappened(_not_in_time(what, seconds, result))
        await asyncio.sleep(step)


def _not_in_time(what: str | Callable[[], str], seconds: float, last: object) -> str:
    described = what if isinstance(what, str) else what()
    shown = repr(last)
    if len(shown) > 500:
        shown = shown[:500] + "..."
    return f"{described}: not so after {seconds:g} s (the check last gave {shown})"


def wait_until_listening(port: int, proc: subprocess.Popen[Any], seconds: float = 20.0) -> None:
    def listening() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            return False

    try:
        eventually(listening, seconds, 0.05, what=f"something listening on port {port}")
    except NeverHappened:
        raise RuntimeError(f"nothing listening on port {port} after {seconds}s") from None


@contextmanager
def running(
    args: list[str], port: int, env: dict[str, str] | None = None, output: Path | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    # Output goes to a file (an unread pipe would block a chatty server) and is shown on failure;
    # to `output` when the test reads it.
    with output.open("w+b") if output is not None else tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
        try:
            try:
                wait_until_listening(port, proc)
            except RuntimeError as exc:
                log.seek(0)
                raise RuntimeError(f"{exc}; output:\n{log.read().decode(errors='replace')}") from None
            try:
                yield proc
            except BaseException:
                # The server's own account of what happened, beside the test's failure.
                log.seek(0)
                print(f"--- output of gateway {' '.join(args)}:\n{log.read().decode(errors='replace')}")
                raise
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def workers_serving(log: Path) -> list[str]:
    """The workers a `gateway serve` whose output is `log` has said are serving, in order of the
    announcements ("worker-1", "worker-2", "worker-1" again after a replacement, ...)."""
    return re.findall(r"Started (worker-\d+)", log.read_text(errors="replace"))


def kill_worker(log: Path, worker: int, seconds: float = 30, then: Callable[[], None] | None = None) -> None:
    """kill -9 worker-`worker` (its latest process) of the `gateway serve` whose output is `log`,
    run `then` (if given), and wait until its replacement serves."""
    name = f"worker-{worker}"
    pid = int(re.findall(rf"Spawning {name} with PID: (\d+)", log.read_text(errors="replace"))[-1])
    serving = workers_serving(log).count(name)
    os.kill(pid, signal.SIGKILL)
    if then is not None:
        then()
    eventually(lambda: workers_serving(log).count(name) > serving, seconds, 0.1, what=f"{name} started again")


def process_tree(pid: int) -> list[int]:
    """A process and all its descendants (a gateway's supervisor and its workers), to kill -9."""
    out = subprocess.run(
        ["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False
    ).stdout.split()
    return [pid, *[d for c in (int(p) for p in out) for d in process_tree(c)]]


def chat_model(
    name: str, upstream: str, sim_url: str, extra: str = "", type_: str = "chat", provider: str = "openai"
) -> str:
    """One [[models]] entry answered by the simulator (any type and provider; chat and openai by default)."""
    base_url = sim_url + "/v1" if provider == "openai" else sim_url
    return f"""
[[models]]
name = "{name}"
type = "{type_}"
{extra}
[models.prices]
input = "2.50"
cached_input = "1.25"
output = "10.00"
search = "0.002"
character = "15.00"
second = "0.0001"
image = "0.04"
[[models.channels]]
provider = "{provider}"
base_url = "{base_url}"
model = "{upstream}"
"""


# ------------------------------------------------------------------ where a gateway keeps its data


@dataclass(frozen=True)
class StoreSpec:
    """A gateway's store: an SQLite file, or a PostgreSQL database plus the Redis prefix that keeps
    its Redis keys apart from every other gateway's. One spec is one deployment: gateways started
    one after the other on the same spec (a restart) share the data."""

    backend: str
    path: Path | None = None  # sqlite
    url: str | None = None  # postgres
    redis_prefix: str | None = None  # postgres

    def toml(self) -> str:
        """The config file's [store] (and [redis]) tables."""
        if self.backend == "sqlite":
            return f'[store]\npath = "{self.path}"\n'
        return (
            f'[store]\nbackend = "postgres"\nurl = "{self.url}"\n'
            f'[redis]\nurl = "{REDIS_URL}"\nprefix = "{self.redis_prefix}"\n'
        )

    def settings(self) -> Settings:
        """Settings for opening this store from the test process (a small pool: tests read little)."""
        if self.backend == "sqlite":
            assert self.path is not None
            return Settings(models=(), store_path=self.path)
        assert self.url is not None and self.redis_prefix is not None
        return Settings(
            models=(),
            store_backend="postgres",
            store_url=self.url,
            store_pool_size=2,
            redis_url=REDIS_URL,
            redis_prefix=self.redis_prefix,
        )


@contextmanager
def store_spec(tmp: Path, backend: str = "sqlite") -> Iterator[StoreSpec]:
    """A new, empty store on `backend`: `tmp`/gateway.db, or a PostgreSQL database of its own
    (gw_<hex>, made from the `test` database) and a Redis prefix of its own, both removed afterwards."""
    if backend == "sqlite":
        yield StoreSpec("sqlite", path=tmp / "gateway.db")
        return
    if backend != "postgres":
        raise ValueError(f"unknown backend {backend!r}")
    with postgres_database() as url:
        prefix = "gwtest-" + urlsplit(url).path.rsplit("_", 1)[-1]
        try:
            yield StoreSpec("postgres", url=url, redis_prefix=prefix)
        finally:
            _forget_redis_prefix(prefix)


@contextmanager
def postgres_database() -> Iterator[str]:
    """The URL of a new, empty PostgreSQL database (gw_<hex>, made through POSTGRES_URL's `test`),
    dropped afterwards with whatever is still connected to it."""
    name = "gw_" + os.urandom(6).hex()
    asyncio.run(_create_database(name))
    try:
        yield _database_url(name)
    finally:
        asyncio.run(_drop_database(name))


def _database_url(name: str) -> str:
    """POSTGRES_URL with another database."""
    return urlsplit(POSTGRES_URL)._replace(path="/" + name).geturl()


async def _create_database(name: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(POSTGRES_URL, timeout=5)
    try:
        for attempt in range(20):
            try:
                await conn.execute(f'CREATE DATABASE "{name}"')
                return
            except asyncpg.exceptions.ObjectInUseError:  # template1 busy: another CREATE DATABASE
                if attempt == 19:
                    raise
                await asyncio.sleep(0.1)
    finally:
        await conn.close()


async def _drop_database(name: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(POSTGRES_URL)
    try:
        await conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1"
            " AND pid <> pg_backend_pid()",
            name,
        )
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


def _forget_redis_prefix(prefix: str) -> None:
    forget_redis_keys(prefix + ":*")


def forget_redis_keys(match: str, url: str = REDIS_URL) -> None:
    """Delete the test Redis's keys that `match` (a SCAN pattern) names, through redis-py (the
    gateway's own client speaks only what the gateway needs)."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=match, count=1000))
        if keys:
            client.delete(*keys)
    except redis.RedisError:
        pass  # only tidiness: the prefix is never used again
    finally:
        client.close()


def with_store(settings: Settings, work: Callable[[Store], Awaitable[T]]) -> T:
    """`work` on the store the settings name, opened for it and closed after (in asyncio.run)."""

    async def go() -> T:
        store = open_store(settings)
        await store.start()
        try:
            return await work(store)
        finally:
            await store.close()

    return asyncio.run(go())


def query(settings: Settings, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    """A read-only SQL query on the store the settings name, written with `?` placeholders. Rows
    come back as tuples, each value as its driver gives it, except money columns (MONEY_COLUMNS, by
    the name the query gives them): Decimal on both backends."""
    if settings.store_backend == "sqlite":
        uri = f"file:{settings.store_path}?mode=ro"
        conn = sqlite3.connect(uri, uri=True)
        try:
            cursor = conn.execute(sql, args)
            names = [d[0] for d in cursor.description or ()]
            rows = cursor.fetchall()
        finally:
            conn.close()
    else:
        assert settings.store_url is not None
        names, rows = _run(_pg_query(settings.store_url, _numbered(sql), args))
    money = [name.lower() in MONEY_COLUMNS for name in names]
    return [
        tuple(Decimal(v) if is_money and v is not None else v for v, is_money in zip(row, money, strict=True))
        for row in rows
    ]


def _run(work: Coroutine[Any, Any, T]) -> T:
    """asyncio.run, also from a coroutine (a store-level test's): then on a thread of its own, the
    caller's loop waiting as it would for a read from SQLite."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(work)
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, work).result()


def _numbered(sql: str) -> str:
    """`?` placeholders as asyncpg's $1, $2, ... (outside quoted strings)."""
    parts = re.split(r"('(?:[^']|'')*')", sql)
    count = 0

    def number(_: re.Match[str]) -> str:
        nonlocal count
        count += 1
        return f"${count}"

    return "".join(part if i % 2 else re.sub(r"\?", number, part) for i, part in enumerate(parts))


async def _pg_query(url: str, sql: str, args: tuple[Any, ...]) -> tuple[list[str], list[tuple[Any, ...]]]:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        async with conn.transaction(readonly=True):
            statement = await conn.prepare(sql)
            names = [a.name for a in statement.get_attributes()]
            rows = await statement.fetch(*args)
    finally:
        await conn.close()
    return names, [tuple(r) for r in rows]


# ------------------------------------------------------------------ a running gateway


@dataclass
class Gateway:
    url: str
    proc: subprocess.Popen[bytes]
    settings: Settings  # as read from its config file
    config_path: Path

    @property
    def backend(self) -> str:
        return self.settings.store_backend

    @property
    def db_path(self) -> Path:
        """The SQLite file, for the tests that are about SQLite itself."""
        assert self.backend == "sqlite", "db_path: this gateway's store is not SQLite"
        return self.settings.store_path

    @property
    def store_settings(self) -> Settings:
        """The settings that open this gateway's store from the test process."""
        return dataclasses.replace(self.settings, store_pool_size=2)

    @property
    def openai_base(self) -> str:
        return self.url + "/v1"

    def with_store(self, work: Callable[[Store], Awaitable[T]]) -> T:
        return with_store(self.store_settings, work)

    def query(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        """A read-only query on this gateway's store (see `query`)."""
        return query(self.settings, sql, *args)

    def new_key(
        self,
        balance: str = "100",
        expires_at_ms: int | None = None,
        credit_limit: str | None = None,
        limit_reset: str | None = None,
        rpm_limit: int | None = None,
        tpm_limit: int | None = None,
    ) -> KeyHandle:
        limit = None if credit_limit is None else Decimal(credit_limit)
        return new_key(
            self.store_settings, Decimal(balance), expires_at_ms, limit, limit_reset, rpm_limit, tpm_limit
        )

    def balance(self, account_id: str) -> Decimal:
        # A plain read, not a store: opening one reclaims dead processes' leases and journals, the
        # gateway's own work, which tests of killed gateways must see it do.
        ((value,),) = self.query("SELECT balance FROM accounts WHERE id = ?", account_id)
        assert isinstance(value, Decimal)
        return value

    def wait_balance(self, account_id: str, expected: Decimal, seconds: float = 5.0) -> Decimal:
        """The balance once it equals `expected` (settlements land moments after the response), or
        whatever it is when time runs out."""
        seen: list[Decimal] = []

        def settled() -> bool:
            seen.append(self.balance(account_id))
            return seen[-1] == expected

        with suppress(NeverHappened):  # not in time: the caller's assertion shows what it is
            eventually(settled, seconds, what=f"the balance of {account_id} at {expected}")
        return seen[-1]

    def usage_record(self, key: str, usage_id: str, seconds: float = 5.0) -> dict[str, Any]:
        """GET /v1/usage/{usage_id} with `key` once it answers (settlements land moments after the
        response)."""
        with self.client(key) as c:
            seen: list[httpx.Response] = []

            def found() -> httpx.Response | None:
                seen.append(c.get(f"/v1/usage/{usage_id}"))
                return seen[-1] if seen[-1].status_code == 200 else None

            r = eventually(
                found,
                seconds,
                0.03,
                what=lambda: f"no usage record {usage_id}: {seen[-1].status_code} {seen[-1].text}",
            )
        return dict(r.json())

    def top_up(self, account_id: str, amount: str) -> None:
        async def go(store: Store) -> tuple[TopUp, bool] | None:
            return await store.top_up(account_id, Decimal(amount), "test")

        assert self.with_store(go) is not None

    def another_key(self, account_id: str) -> KeyHandle:
        """A second key of an existing account."""

        async def go(store: Store) -> KeyHandle:
            key = generate_key()
            record = await store.create_key(account_id, "another", hash_key(key), display_prefix(key), None)
            return KeyHandle(key=key, key_id=record.id, account_id=account_id)

        return self.with_store(go)

    def delete_key(self, key_id: str) -> None:
        async def go(store: Store) -> bool:
            return await store.delete_key(key_id)

        self.with_store(go)

    def client(self, key: str | None) -> httpx.Client:
        headers = {"authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def admin(self, token: str) -> httpx.Client:
        """A client of the management API (/admin/v1) with the admin token."""
        headers = {"authorization": f"Bearer {token}"}
        return httpx.Client(base_url=self.url + "/admin/v1", headers=headers, timeout=30)


@dataclass
class KeyHandle:
    key: str
    key_id: str
    account_id: str


async def funded_key(store: Store, balance: Decimal) -> tuple[KeyContext, bytes]:
    """A new account holding `balance`, with one key, in a started `store`: the key's context as
    `store` finds it, and the key's hash (for another process's store: find_key)."""
    account = await store.create_account("acct-" + os.urandom(6).hex(), balance)
    secret = generate_key()
    await store.create_key(account.id, "k", hash_key(secret), display_prefix(secret), None)
    ctx = await store.find_key(hash_key(secret))
    assert ctx is not None
    return ctx, hash_key(secret)


def new_key(
    settings: Settings,
    balance: Decimal,
    expires_at_ms: int | None = None,
    credit_limit: Decimal | None = None,
    limit_reset: str | None = None,
    rpm_limit: int | None = None,
    tpm_limit: int | None = None,
) -> KeyHandle:
    """A new account with `balance` and one key, in the store the settings name."""

    async def go(store: Store) -> KeyHandle:
        account = await store.create_account(
            "acct-" + os.urandom(6).hex(), balance, rpm_limit=rpm_limit, tpm_limit=tpm_limit
        )
        key = generate_key()
        record = await store.create_key(
            account.id,
            "test",
            hash_key(key),
            display_prefix(key),
            expires_at_ms,
            credit_limit=credit_limit,
            limit_reset=limit_reset,
        )
        return KeyHandle(key=key, key_id=record.id, account_id=account.id)

    return with_store(settings, go)


@contextmanager
def gateway(
    tmp: Path,
    models_toml: str,
    limits_toml: str = "",
    server_toml: str = "",
    env: dict[str, str] | None = None,
    routing_toml: str = "retry_backoff_seconds = 0.01",
    backend: str = "sqlite",
    store: StoreSpec | None = None,
) -> Iterator[Gateway]:
    """A gateway on `backend` with a new store, removed afterwards; or on `store`, which outlives it
    (a restart: the next gateway on the same spec finds the same data)."""
    if store is None:
        with (
            store_spec(tmp, backend) as spec,
            gateway(tmp, models_toml, limits_toml, server_toml, env, routing_toml, store=spec) as g,
        ):
            yield g
        return
    port = free_port()
    config = tmp / "gateway.toml"
    config.write_text(
        # No drain notice: a test's gateway stops at once (test_drain_reload tests the notice).
        f"[server]\nport = {port}\ndrain_notice_seconds = 0\n{server_toml}\n{store.toml()}"
        f"[routing]\n{routing_toml}\n[limits]\n{limits_toml}\n{models_toml}"
    )
    settings = load_settings(config)
    with running(["serve", "--config", str(config)], port, env) as proc:
        yield Gateway(url=f"http://127.0.0.1:{port}", proc=proc, settings=settings, config_path=config)


def new_console_user(
    settings: Settings, account_id: str | None, role: str = "member", password: str | None = None
) -> tuple[str, str]:
    """A console user with a password already set (no invitation), in the store the settings name;
    returns (email, password)."""
    from gateway.console.security import hash_password

    email = f"user-{os.urandom(4).hex()}@example.com"
    chosen = password or "pw-" + os.urandom(8).hex()

    async def go(store: Store) -> None:
        user = await store.create_console_user(email, role, account_id, None, None)
        await store.set_console_password(user.id, hash_password(chosen))

    with_store(settings, go)
    return email, chosen


# The console's screenshots (docs/console/*.png, shown in the README and docs/console.md) are
# written there by the browser tests under `make screenshots` (GATEWAY_SCREENSHOTS=1); otherwise
# into a temporary directory, so that a test run leaves the working tree as it was.
SCREENSHOTS = Path(__file__).resolve().parents[1] / "docs" / "console"


def screenshot(page: Any, name: str) -> Path:
    """Save a full-page screenshot of a Playwright page as `name`.png (see SCREENSHOTS)."""
    folder = (
        SCREENSHOTS
        if os.environ.get("GATEWAY_SCREENSHOTS")
        else Path(tempfile.gettempdir()) / "gateway-shots"
    )
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def job_leases(gw: Gateway) -> list[tuple[str, Decimal]]:
    """(owner, amount) of every lease held by an asynchronous job (gateway.jobs)."""
    rows = gw.query("SELECT owner, amount FROM leases WHERE owner LIKE 'job:%'")
    return [(owner, amount) for owner, amount in rows]


def request_logs(admin: httpx.Client, key_id: str, count: int, **query: str) -> list[dict[str, Any]]:
    """The key's newest request log entries once there are `count` (they are written moments after
    the answer), or what there is after 5 s."""
    seen: list[list[dict[str, Any]]] = []

    def enough() -> bool:
        r = admin.get("/logs", params={"key_id": key_id, **query})
        assert r.status_code == 200, r.text
        seen.append(r.json()["data"])
        return len(seen[-1]) >= count

    with suppress(NeverHappened):  # not in time: the caller's assertion shows what there is
        eventually(enough, 5, what=f"{count} request log entries of {key_id}")
    return seen[-1]


@dataclass(frozen=True)
class ChatStream:
    """A streamed chat completion as it went over the wire: the request's bytes, the data of every
    event the client received, and the content text they carried."""

    body: bytes
    events: list[str]
    text: str


def chat_stream(gw: Gateway, key: str, model: str, content: str) -> ChatStream:
    """POST a streamed chat completion with one user message, read to its end (an error event
    included), with a plain HTTP client: the exact bytes the gateway counts a prompt from."""
    body = orjson.dumps({"model": model, "messages": [{"role": "user", "content": content}], "stream": True})
    with httpx.stream(
        "POST",
        f"{gw.url}/v1/chat/completions",
        content=body,
        headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
        timeout=30,
    ) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    text = "".join(
        choice["delta"].get("content") or ""
        for event in events
        if event != "[DONE]"
        for choice in orjson.loads(event).get("choices", [])
    )
    return ChatStream(body, events, text)


def sim_requests(sim: httpx.Client, marker: str) -> list[dict[str, Any]]:
    """Bodies the simulator received whose messages mention `marker`."""
    entries = sim.get("/_sim/requests").json()
    return [e["body"] for e in entries if "body" in e and marker in str(e["body"].get("messages"))]

"""Several `gateway serve` instances on one PostgreSQL database and one Redis (issue 14's scaled-out
set-up), for the multi-instance and fault tests; and throwaway PostgreSQL and Redis servers that a
test may stop and start again without touching the machine's shared ones."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

import asyncpg

from gateway.auth import display_prefix, generate_key, hash_key
from gateway.config import Settings
from gateway.store import open_store
from harness import free_port, process_tree, wait_until_listening

ADMIN_TOKEN_ENV = "GATEWAY_TEST_ADMIN_TOKEN"
ADMIN_TOKEN = "admin-" + "0123456789abcdef" * 3


@dataclass
class Key:
    key: str
    key_id: str
    account_id: str


class Instance:
    """One `gateway serve --config X --port P`: its supervisor and workers, which can be killed (the
    whole tree, kill -9) and started again on the same port."""

    def __init__(self, config: Path, log: Path, env: dict[str, str]) -> None:
        self.port = free_port()
        self.config = config
        self.log_path = log
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop/kill
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gateway",
                "serve",
                "--config",
                str(self.config),
                "--port",
                str(self.port),
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **self.env},
        )

    def wait_ready(self, seconds: float = 30.0) -> None:
        assert self.proc is not None
        try:
            wait_until_listening(self.port, self.proc, seconds)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}; output:\n{self.output()}") from None

    def worker_pids(self) -> list[int]:
        assert self.proc is not None
        return process_tree(self.proc.pid)[1:]

    def kill(self) -> list[int]:
        """kill -9 of the supervisor and every worker at once; returns their pids."""
        assert self.proc is not None
        pids = process_tree(self.proc.pid)
        for pid in pids:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait()
        self.proc = None
        self._close_log()
        return pids

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            for pid in process_tree(self.proc.pid):
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None
        self._close_log()

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


class Cluster:
    """`count` instances of `workers` worker processes each, one configuration file (store, Redis,
    models), every instance on its own port."""

    def __init__(
        self,
        tmp: Path,
        database_url: str,
        redis_url: str,
        models_toml: str,
        count: int = 3,
        workers: int = 2,
        extra_toml: str = "",
    ) -> None:
        self.database_url = database_url
        self.redis_url = redis_url
        self.prefix = "gwcluster-" + uuid.uuid4().hex[:12]
        self.config = tmp / "gateway.toml"
        self.config.write_text(
            f"[server]\nworkers = {workers}\ndrain_notice_seconds = 0\n"
            f'[store]\nbackend = "postgres"\nurl = "{database_url}"\npool_size = 5\n'
            f'[redis]\nurl = "{redis_url}"\nprefix = "{self.prefix}"\n'
            f'[routing]\nretry_backoff_seconds = 0.01\n[admin]\ntoken_env = "{ADMIN_TOKEN_ENV}"\n'
            f"{extra_toml}\n{models_toml}"
        )
        env = {ADMIN_TOKEN_ENV: ADMIN_TOKEN}
        self.instances = [Instance(self.config, tmp / f"gateway-{i}.log", env) for i in range(count)]

    @property
    def urls(self) -> list[str]:
        return [i.url for i in self.instances]

    def start(self) -> None:
        for instance in self.instances:
            instance.start()
        for instance in self.instances:
            instance.wait_ready()

    def stop(self) -> None:
        for instance in self.instances:
            instance.stop()

    def settings(self) -> Settings:
        """What opens the cluster's store from the test process."""
        return Settings(
            models=(),
            store_backend="postgres",
            store_url=self.database_url,
            store_pool_size=2,
            redis_url=self.redis_url,
            redis_prefix=self.prefix,
        )

    def new_key(self, balance: Decimal | str, rpm_limit: int | None = None) -> Key:
        """A new account with `balance` and one key."""

        async def go() -> Key:
            store = open_store(self.settings())
            await store.start()
            try:
                account = await store.create_account(
                    "acct-" + os.urandom(6).hex(), Decimal(balance), rpm_limit=rpm_limit
                )
                key = generate_key()
                record = await store.create_key(account.id, "test", hash_key(key), display_prefix(key), None)
                return Key(key, record.id, account.id)
            finally:
                await store.close()

        return asyncio.run(go())

    def query(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        return query(self.database_url, sql, *args)

    def ledger(self, account_id: str) -> tuple[Decimal, Decimal, Decimal, int]:
        """(balance, the sum of its usage records' costs, the sum of its request log's costs, how
        many usage records)."""
        ((balance, usage, logged, count),) = self.query(
            "SELECT balance,"
            " (SELECT coalesce(sum(cost), 0) FROM usage_records WHERE account_id = $1),"
            " (SELECT coalesce(sum(cost), 0) FROM request_logs WHERE account_id = $1),"
            " (SELECT count(*) FROM usage_records WHERE account_id = $1)"
            " FROM accounts WHERE id = $1",
            account_id,
        )
        return Decimal(balance), Decimal(usage), Decimal(logged), int(count)

    def held(self, account_id: str) -> Decimal:
        """What the account's leases set aside (every owner's)."""
        ((amount,),) = self.query(
            "SELECT coalesce(sum(amount), 0) FROM leases WHERE kind = 'account' AND pot_id = $1", account_id
        )
        return Decimal(amount)


def query(url: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    async def go() -> list[tuple[Any, ...]]:
        conn = await asyncpg.connect(url, timeout=5)
        try:
            return [tuple(row) for row in await conn.fetch(sql, *args)]
        finally:
            await conn.close()

    return asyncio.run(go())


@contextmanager
def database(server_url: str) -> Iterator[str]:
    """A new, empty database on the PostgreSQL server of `server_url` (through its database), dropped
    afterwards with whatever is still connected to it."""
    name = "gwcluster_" + os.urandom(6).hex()

    async def admin(sql: str) -> None:
        conn = await asyncpg.connect(server_url, timeout=5)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(admin(f'CREATE DATABASE "{name}"'))
    try:
        yield urlsplit(server_url)._replace(path="/" + name).geturl()
    finally:
        with suppress(OSError, asyncpg.PostgresError):
            asyncio.run(admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def forget_redis_prefix(redis_url: str, prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        keys = list(client.scan_iter(match=prefix + ":*", count=1000))
        if keys:
            client.delete(*keys)
    except redis.RedisError:
        pass
    finally:
        client.close()


# ------------------------------------------------------------------ throwaway services


class ThrowawayRedis:
    """A redis-server of the test's own (no persistence: a restart comes back empty)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary is not None
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until_listening(self.port, self.proc, 10)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def postgres_bin() -> Path | None:
    """The directory of initdb and pg_ctl, if PostgreSQL's server programs are installed."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    if found:
        return found[-1].parent
    pg_ctl = shutil.which("pg_ctl")
    return Path(pg_ctl).parent if pg_ctl else None


class ThrowawayPostgres:
    """A PostgreSQL cluster of the test's own, in a temporary directory, on a free port, with trust
    authentication. PostgreSQL refuses to run as root: as root it runs as the `postgres` user."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin = bin_dir
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="gw-pg-"))
        self.data = self.dir / "data"
        self._as: list[str] = []
        if os.geteuid() == 0:
            self._as = ["runuser", "-u", "postgres", "--"]
            shutil.chown(self.dir, "postgres")

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        subprocess.run([*self._as, *args], check=True, capture_output=True, timeout=60)

    def init(self) -> None:
        self._run(
            str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync"
        )

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
            " -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        self._run(
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", options, "-l", str(self.dir / "log"), "-w",
            "start",
        )  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def remove(self) -> None:
        with suppress(subprocess.SubprocessError, OSError):
            self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)

"""Real processes for tests: the simulator and the gateway under Granian, on free loopback ports."""

from __future__ import annotations

import asyncio
import os
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx

from gateway.auth import display_prefix, generate_key, hash_key
from gateway.store.sqlite import SqliteStore


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until_listening(port: int, proc: subprocess.Popen[bytes], seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listening on port {port} after {seconds}s")


@contextmanager
def running(
    args: list[str], port: int, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    # Output goes to a file (an unread pipe would block a chatty server) and is shown on failure.
    with tempfile.TemporaryFile() as log:
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
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


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


@dataclass
class Gateway:
    url: str
    db_path: Path
    proc: subprocess.Popen[bytes]

    @property
    def openai_base(self) -> str:
        return self.url + "/v1"

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
        return asyncio.run(
            _new_key(self.db_path, Decimal(balance), expires_at_ms, limit, limit_reset, rpm_limit, tpm_limit)
        )

    def balance(self, account_id: str) -> Decimal:
        with sqlite3.connect(self.db_path) as conn:
            (value,) = conn.execute("SELECT balance FROM accounts WHERE id = ?", (account_id,)).fetchone()
        return Decimal(value)

    def wait_balance(self, account_id: str, expected: Decimal, seconds: float = 5.0) -> Decimal:
        """The balance once it equals `expected` (settlements land moments after the response), or
        whatever it is when time runs out."""
        deadline = time.monotonic() + seconds
        while (value := self.balance(account_id)) != expected and time.monotonic() < deadline:
            time.sleep(0.02)
        return value

    def delete_key(self, key_id: str) -> None:
        async def go() -> None:
            store = SqliteStore(self.db_path)
            await store.start()
            try:
                await store.delete_key(key_id)
            finally:
                await store.close()

        asyncio.run(go())

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


async def _new_key(
    db_path: Path,
    balance: Decimal,
    expires_at_ms: int | None,
    credit_limit: Decimal | None = None,
    limit_reset: str | None = None,
    rpm_limit: int | None = None,
    tpm_limit: int | None = None,
) -> KeyHandle:
    store = SqliteStore(db_path)
    await store.start()
    try:
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
    finally:
        await store.close()


@contextmanager
def gateway(
    tmp: Path,
    models_toml: str,
    limits_toml: str = "",
    server_toml: str = "",
    env: dict[str, str] | None = None,
    routing_toml: str = "retry_backoff_seconds = 0.01",
) -> Iterator[Gateway]:
    port = free_port()
    db = tmp / "gateway.db"
    config = tmp / "gateway.toml"
    config.write_text(
        f'[server]\nport = {port}\n{server_toml}\n[store]\npath = "{db}"\n'
        f"[routing]\n{routing_toml}\n[limits]\n{limits_toml}\n{models_toml}"
    )
    with running(["serve", "--config", str(config)], port, env) as proc:
        yield Gateway(url=f"http://127.0.0.1:{port}", db_path=db, proc=proc)


def job_leases(gw: Gateway) -> list[tuple[str, str]]:
    """(owner, amount) of every lease held by an asynchronous job (gateway.jobs)."""
    with sqlite3.connect(gw.db_path) as conn:
        return conn.execute("SELECT owner, amount FROM leases WHERE owner LIKE 'job:%'").fetchall()


def request_logs(admin: httpx.Client, key_id: str, count: int, **query: str) -> list[dict[str, Any]]:
    """The key's newest request log entries once there are `count` (they are written moments after
    the answer), or what there is after 5 s."""
    deadline = time.monotonic() + 5
    while True:
        r = admin.get("/logs", params={"key_id": key_id, **query})
        assert r.status_code == 200, r.text
        data: list[dict[str, Any]] = r.json()["data"]
        if len(data) >= count or time.monotonic() > deadline:
            return data
        time.sleep(0.02)


def sim_requests(sim: httpx.Client, marker: str) -> list[dict[str, object]]:
    """Bodies the simulator received whose messages mention `marker`."""
    entries = sim.get("/_sim/requests").json()
    return [e["body"] for e in entries if "body" in e and marker in str(e["body"].get("messages"))]

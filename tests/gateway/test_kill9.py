"""kill -9 at random moments: what was delivered is billed, and the ledger balances to the micro-dollar.

A running stream journals its progress (what it delivered) after its first output and then at
least every 64 chunks or every second, so a killed process's streams are billed what they
delivered up to that bound. A charge, its usage record and its request log entry are one journaled
step, so no kill can part them: afterwards deposits = balance + charges = balance + the usage
records' costs = balance + the request log's costs, with every hold back.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from gateway.config import Settings
from gateway.core import count_tokens
from harness import (
    KeyHandle,
    StoreSpec,
    chat_model,
    free_port,
    new_key,
    process_tree,
    query,
    store_spec,
    wait_until_listening,
)

MODEL = "openai/gpt-4o-mini"
# The bound of what a killed stream may leave unbilled (routes/streaming.py: PROGRESS_CHUNKS).
PROGRESS_CHUNKS = 64


class Instance:
    """A `gateway serve` on a fixed port and store, which can be killed and started again."""

    def __init__(self, tmp: Path, sim_url: str, workers: int, store: StoreSpec) -> None:
        self.port = free_port()
        self.workers = workers
        self.settings: Settings = store.settings()
        self.config = tmp / "gateway.toml"
        self.config.write_text(
            f"[server]\nport = {self.port}\nworkers = {workers}\n{store.toml()}"
            + chat_model(MODEL, "gpt-4o-mini", sim_url)
        )
        self.log = open(tmp / "gateway.log", "ab")  # noqa: SIM115 - kept open across restarts
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--config", str(self.config)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        wait_until_listening(self.port, self.proc)

    def kill(self) -> None:
        """kill -9 the supervisor and every worker at once."""
        assert self.proc is not None
        for pid in process_tree(self.proc.pid):
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait()

    def kill_a_worker(self) -> None:
        assert self.proc is not None
        workers = process_tree(self.proc.pid)[1:]
        if workers:
            with suppress(ProcessLookupError):
                os.kill(random.choice(workers), signal.SIGKILL)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc = None

    def new_key(self, balance: str) -> KeyHandle:
        return new_key(self.settings, Decimal(balance))

    def query(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        return query(self.settings, sql, *args)


@contextmanager
def instance(tmp: Path, sim_url: str, workers: int = 1, backend: str = "sqlite") -> Iterator[Instance]:
    with store_spec(tmp, backend) as store:
        g = Instance(tmp, sim_url, workers, store)
        g.start()
        try:
            yield g
        finally:
            g.stop()
            g.log.close()


def stream_chat(url: str, key: str, content: str, read_chunks: int) -> tuple[str, str]:
    """Read a streamed chat answer until `read_chunks` content chunks came; returns (id, text)."""
    text, rid = "", ""
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "stream": True}
    headers = {"authorization": f"Bearer {key}"}
    with (
        httpx.Client(base_url=url, timeout=30) as c,
        c.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r,
    ):
        assert r.status_code == 200
        chunks = 0
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            data = orjson.loads(line[len("data: ") :])
            rid = data["id"]
            for choice in data.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content") or ""
                if piece:
                    text += piece
                    chunks += 1
            if chunks >= read_chunks:
                return rid, text
    return rid, text


# SQLite only: the restart replaying the dead process's journal is the embedded store's way. On
# PostgreSQL a dead owner's streams are billed by a live process's reclaim, within its 20 s bound
# (test_store_postgres.py, and the ledger test below).
@pytest.mark.slow
@pytest.mark.parametrize("victim", ["gateway", "workers"])
def test_kill_9_mid_stream_bills_what_was_delivered(sim_url: str, tmp_path: Path, victim: str) -> None:
    with instance(tmp_path, sim_url, workers=1 if victim == "gateway" else 2) as g:
        key = g.new_key("10")
        # 20 ms a chunk: the client has read 100 when the process dies (2 s in: two progress marks).
        content = "long [sim tokens=400 pace=20ms]"
        got: dict[str, tuple[str, str]] = {}
        reader = threading.Thread(
            target=lambda: got.setdefault("r", stream_chat(g.url, key.key, content, 100)), daemon=True
        )
        reader.start()
        reader.join(20)
        rid, text = got["r"]
        if victim == "gateway":
            g.kill()
            g.start()  # the restart replays the dead process's journal
        else:
            for pid in process_tree(g.proc.pid if g.proc else 0)[1:]:
                os.kill(pid, signal.SIGKILL)  # the supervisor respawns them; a new one replays
        received = count_tokens(text, "o200k_base")
        assert received == 100
        deadline = time.monotonic() + 20
        while not (
            rows := g.query("SELECT status, completion_tokens, cost FROM usage_records WHERE id = ?", rid)
        ):
            assert time.monotonic() < deadline, "the delivered output was never billed"
            time.sleep(0.1)
        ((status, completion, cost),) = rows
        assert status == "incomplete"
        # Billed what was delivered, up to the journaling bound; never what was not generated.
        assert received - PROGRESS_CHUNKS <= completion <= received + 5, (completion, received)
        logged = g.query("SELECT cost, usage_id FROM request_logs WHERE usage_id = ?", rid)
        assert logged == [(cost, rid)]
        ((balance,),) = g.query("SELECT balance FROM accounts WHERE id = ?", key.account_id)
        assert balance == Decimal(10) - cost


def _slow_commits(url: str, seconds: float) -> None:
    """Every usage record inserted from now on takes `seconds` before its transaction can commit."""

    async def run() -> None:
        import asyncpg

        conn = await asyncpg.connect(url)
        try:
            await conn.execute(
                "CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS"
                f" $$BEGIN PERFORM pg_sleep({seconds}); RETURN NEW; END$$;"
                " CREATE TRIGGER slow_commit AFTER INSERT ON usage_records"
                " FOR EACH ROW EXECUTE FUNCTION slow_commit()"
            )
        finally:
            await conn.close()

    asyncio.run(run())


def test_postgres_answer_before_its_commit_survives_kill_9(
    sim_url: str, tmp_path: Path, postgres_url: str, redis_url: str
) -> None:
    """On PostgreSQL an answer waits until its settlement has been handed to the database, not for
    the commit (store/postgres/writer.py): the gateway killed in between, the database still commits
    the charge, its usage record and its log entry."""
    with instance(tmp_path, sim_url, backend="postgres") as g:
        key = g.new_key("10")
        headers = {"authorization": f"Bearer {key.key}"}
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Say something."}]}
        with httpx.Client(base_url=g.url, timeout=30) as c:
            for _ in range(3):  # the writer's connections open
                assert c.post("/v1/chat/completions", json=body, headers=headers).status_code == 200
            assert g.settings.store_url is not None
            _slow_commits(g.settings.store_url, 2.0)
            answer = c.post("/v1/chat/completions", json=body, headers=headers)
        assert answer.status_code == 200
        usage_id = answer.json()["id"]
        # Answered while its settlement was still committing ...
        assert not g.query("SELECT id FROM usage_records WHERE id = ?", usage_id)
        g.kill()  # ... and the gateway gone before the commit.
        deadline = time.monotonic() + 15
        while not (found := g.query("SELECT cost FROM usage_records WHERE id = ?", usage_id)):
            assert time.monotonic() < deadline, "the charge of an answered request was lost"
            time.sleep(0.1)
        ((cost,),) = found
        assert cost > 0
        assert g.query("SELECT cost FROM request_logs WHERE usage_id = ?", usage_id) == [(cost,)]
        ((charged,),) = g.query("SELECT sum(cost) AS cost FROM usage_records WHERE key_id = ?", key.key_id)
        ((balance,),) = g.query("SELECT balance FROM accounts WHERE id = ?", key.account_id)
        assert balance == Decimal(10) - charged


@pytest.mark.slow
def test_ledger_balances_after_random_kill_9_under_mixed_traffic(
    sim_url: str, tmp_path: Path, backend: str
) -> None:
    """Continuous plain and streamed traffic (some clients leaving mid-stream) while workers and
    twice the whole gateway are killed with SIGKILL at random moments."""
    deposit = Decimal(5)
    rng = random.Random(1313)
    answered: set[str] = set()
    stop = threading.Event()
    with instance(tmp_path, sim_url, workers=2, backend=backend) as g:
        key = g.new_key(str(deposit))

        def client(seed: int) -> None:
            r = random.Random(seed)
            headers = {"authorization": f"Bearer {key.key}"}
            with httpx.Client(base_url=g.url, timeout=10, headers=headers) as c:
                while not stop.is_set():
                    kind = r.choice(["plain", "stream", "leave"])
                    tokens = r.randint(5, 60)
                    body: dict[str, Any] = {
                        "model": MODEL,
                        "messages": [
                            {"role": "user", "content": f"chaos {seed} [sim tokens={tokens} pace=2ms]"}
                        ],
                    }
                    try:
                        if kind == "plain":
                            resp = c.post("/v1/chat/completions", json=body)
                            if resp.status_code == 200:
                                answered.add(resp.json()["id"])
                            continue
                        body["stream"] = True
                        with c.stream("POST", "/v1/chat/completions", json=body) as resp:
                            for i, _ in enumerate(resp.iter_lines()):
                                if kind == "leave" and i > r.randint(1, 20):
                                    break
                    except httpx.HTTPError:
                        time.sleep(0.05)  # the gateway is down or restarting

        clients = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(8)]
        for t in clients:
            t.start()
        began = time.monotonic()
        whole_kills = 0
        while time.monotonic() - began < 24:
            time.sleep(rng.uniform(1.0, 2.5))  # a random moment under traffic for the next kill
            if whole_kills < 2 and time.monotonic() - began > 7 * (whole_kills + 1):
                g.kill()
                whole_kills += 1
                g.start()
            else:
                g.kill_a_worker()
        stop.set()
        for t in clients:
            t.join(15)
        g.stop()
        g.start()  # a clean start replays whatever the last killed workers journaled (SQLite)
        if backend == "postgres":
            # The killed workers' owners are reclaimed by a live one's housekeeping, their streams'
            # progress billed, within the stated bound (gateway.store.postgres: 20 s).
            deadline = time.monotonic() + 30
            while g.query("SELECT COUNT(*) FROM owners")[0][0] > g.workers:
                assert time.monotonic() < deadline, g.query("SELECT id, heartbeat_at FROM owners")
                time.sleep(0.5)
        g.stop()  # and a clean stop gives every lease back
        assert whole_kills == 2
        assert len(answered) > 100

        ((balance,),) = g.query("SELECT balance FROM accounts WHERE id = ?", key.account_id)
        charges = sum((c for (c,) in g.query("SELECT cost FROM usage_records")), Decimal(0))
        logged = sum(
            (c for (c,) in g.query("SELECT cost FROM request_logs WHERE cost IS NOT NULL")), Decimal(0)
        )
        assert charges > 0
        assert deposit == balance + charges, (deposit, balance, charges)
        assert deposit == balance + logged, (deposit, balance, logged)
        # Every charge has its log entry, with the same cost; every answered plain request its record.
        unlogged = g.query(
            "SELECT u.id FROM usage_records u LEFT JOIN request_logs l ON l.usage_id = u.id"
            " WHERE l.id IS NULL OR l.cost != u.cost",
        )
        assert unlogged == []
        recorded = {rid for (rid,) in g.query("SELECT id FROM usage_records")}
        assert answered <= recorded
        assert g.query("SELECT owner, amount FROM leases") == []  # every hold came back

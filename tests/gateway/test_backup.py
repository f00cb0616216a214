"""`gateway admin backup-store` (docs/operations.md, "Backups"): the embedded store copied while
the gateway serves, as of one moment (every charge in the copy with its usage record, a balance
that is its opening less exactly the copy's records), checked, never over an existing file; a
PostgreSQL store is pointed to its own tools; a gateway started on the copy serves it."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
import sys
import threading
from decimal import Decimal
from pathlib import Path

import httpx

from harness import chat_model, gateway

MODEL = "openai/gpt-4o-mini"


def backup(config: Path, to: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "admin", "backup-store", "--config", str(config), "--to", str(to)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_backup_while_serving_is_one_moment_of_the_store(tmp_path: Path, sim_url: str) -> None:
    with gateway(tmp_path, chat_model(MODEL, "gpt-4o-mini", sim_url)) as gw:
        handle = gw.new_key(balance="100")
        stop = threading.Event()
        answered: list[int] = []

        def traffic() -> None:
            with httpx.Client(base_url=gw.url, headers={"authorization": f"Bearer {handle.key}"}) as c:
                while not stop.is_set():
                    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
                    answered.append(c.post("/v1/chat/completions", json=body, timeout=30).status_code)

        senders = [threading.Thread(target=traffic) for _ in range(4)]
        for sender in senders:
            sender.start()
        try:
            while len(answered) < 40:  # charges landing while the copy is taken
                stop.wait(0.05)
            copy = tmp_path / "backups" / "gateway-copy.db"
            copy.parent.mkdir()
            done = backup(gw.config_path, copy)
        finally:
            stop.set()
            for sender in senders:
                sender.join()
        assert done.returncode == 0, done.stderr
        said = json.loads(done.stdout)
        assert said["backup"] == str(copy) and said["bytes"] == copy.stat().st_size > 0
        assert copy.stat().st_mode & 0o077 == 0  # as private as the store
        assert set(answered) == {200}
        with contextlib.closing(sqlite3.connect(copy)) as db:
            ((balance,),) = db.execute("SELECT balance FROM accounts WHERE id = ?", (handle.account_id,))
            costs = [Decimal(c) for (c,) in db.execute(
                "SELECT cost FROM usage_records WHERE account_id = ?", (handle.account_id,)
            )]  # fmt: skip
            (logged,) = db.execute(
                "SELECT count(*) FROM request_logs WHERE usage_id IN (SELECT id FROM usage_records)"
            ).fetchone()
        assert costs and Decimal(balance) + sum(costs) == Decimal(100)
        assert logged == len(costs)  # each charge with its log entry, as they are written together
        # Never over a file; PostgreSQL's is its own tools' work.
        again = backup(gw.config_path, copy)
        assert again.returncode == 1 and "exists already" in again.stderr, again.stderr
        # Two at once to one name (diff review: the second replaced the first): one copy is kept.
        twice = tmp_path / "backups" / "twice.db"
        racing = [
            subprocess.Popen(
                [sys.executable, "-m", "gateway", "admin", "backup-store", "--config", str(gw.config_path),
                 "--to", str(twice)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )
            for _ in range(2)
        ]  # fmt: skip
        ended = [p.communicate(timeout=60) for p in racing]
        assert sorted(p.returncode for p in racing) == [0, 1], ended
        assert any("exists already" in err for _, err in ended), ended
        assert sorted(path.name for path in twice.parent.iterdir()) == ["gateway-copy.db", "twice.db"]
        # Never one of the store's own names (black-box review: SQLite took a `-journal` copy as
        # its own and deleted it at the next open).
        store = gw.store_settings.store_path
        sqlite_journal = store.with_name(store.name + "-journal")
        for own in (sqlite_journal, store.with_name(store.name + ".journal") / "x.db"):
            said_own = backup(gw.config_path, own)
            assert said_own.returncode == 1 and "the store's own files" in said_own.stderr, said_own.stderr
        assert not sqlite_journal.exists()
        nowhere = backup(gw.config_path, tmp_path / "no-such-dir" / "copy.db")
        assert nowhere.returncode == 1 and "no such directory" in nowhere.stderr, nowhere.stderr
    pg = tmp_path / "pg.toml"
    pg.write_text(
        '[store]\nbackend = "postgres"\nurl = "postgresql://h/db"\n' + chat_model(MODEL, "m", sim_url)
    )
    refused = backup(pg, tmp_path / "pg-copy.db")
    assert refused.returncode == 1 and "pg_dump" in refused.stderr, refused.stderr
    # The copy is a store a gateway serves.
    restored = tmp_path / "restored"
    restored.mkdir()
    (restored / "gateway.db").write_bytes(copy.read_bytes())
    with gateway(restored, chat_model(MODEL, "gpt-4o-mini", sim_url)) as gw2:
        assert gw2.balance(handle.account_id) == Decimal(balance)
        answer = httpx.post(
            f"{gw2.url}/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
            headers={"authorization": f"Bearer {handle.key}"},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text

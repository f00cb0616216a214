"""The settlement journal: a charge survives a killed process, and is applied exactly once."""

from __future__ import annotations

import asyncio
import fnmatch
import os
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import replace
from decimal import Decimal
from pathlib import Path

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_store_contract import log_entry

from gateway.auth import display_prefix, generate_key, hash_key
from gateway.clock import now_ms
from gateway.core import AppendFile
from gateway.errors import ServiceUnavailable
from gateway.store import RequestLog, Settlement, StoredImage, UsageRecord
from gateway.store.sqlite import SqliteStore
from gateway.store.sqlite import journal as journal_module
from gateway.store.sqlite.journal import Journal, decode, encode, live_count, orphans, owners, staging_name
from harness import chat_model, free_port, process_tree, running


def record(account_id: str, i: int, cost: str = "0.001") -> UsageRecord:
    return UsageRecord(
        f"chatcmpl-{i}", f"req_{i}", "key_x", account_id, "m", "completed", 10, 5, Decimal(cost), 1, 2
    )


async def open_store(path: Path) -> SqliteStore:
    store = SqliteStore(path)
    await store.start()
    return store


def new_account(db: Path) -> str:
    """An account "a" with $10 in a new store at `db`, closed again."""

    async def setup() -> str:
        store = await open_store(db)
        account = await store.create_account("a", Decimal(10))
        await store.close()
        return account.id

    return asyncio.run(setup())


def journal_and_die(db: Path, *lines: str, block_writer_at: int = 0) -> None:
    """In a child process with a started store at `db` (as `store`), run `lines` (the body of an
    async function), blocking the store's writer with an exclusive lock before line
    `block_writer_at`, so that what they settle is journaled but never applied; then die without
    any cleanup, as under kill -9."""
    block = ["blocker = sqlite3.connect(db, isolation_level=None)", "blocker.execute('BEGIN EXCLUSIVE')"]
    body = [*lines[:block_writer_at], *block, *lines[block_writer_at:]]
    child = "\n".join(
        [
            "import asyncio, os, sqlite3",
            "from decimal import Decimal",
            "from gateway.store import KeptAnswer, StoredAnswer, UsageRecord",
            "from gateway.store.sqlite import SqliteStore",
            f"db = {str(db)!r}",
            "async def main():",
            "    store = SqliteStore(db)",
            "    await store.start()",
            *("    " + line for line in body),
            "    print('journaled', flush=True)",
            "    os._exit(0)",
            "asyncio.run(main())",
        ]
    )
    out = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, timeout=60, check=False
    )
    assert "journaled" in out.stdout, out.stderr


def test_settlements_of_a_killed_process_are_replayed_once(tmp_path: Path) -> None:
    db = tmp_path / "g.db"
    account_id = new_account(db)
    # A child journals 50 settlements while its own writer is blocked by an exclusive lock it holds,
    # then dies without any cleanup, as under kill -9.
    journal_and_die(
        db,
        "for i in range(50):",
        f"    await store.settle(UsageRecord(f'chatcmpl-{{i}}', 'r', 'k', {account_id!r}, 'm', 'completed',"
        " 10, 5, Decimal('0.001'), 1, 2))",
    )
    assert list((tmp_path / "g.db.journal").glob("*.jsonl")), "the dead process's journal is left behind"

    async def check() -> tuple[Decimal, int]:
        store = await open_store(db)  # replays the orphaned journal
        try:
            account = await store.find_account("a")
            assert account is not None
            found = [await store.get_usage(f"chatcmpl-{i}", "k") for i in range(50)]
            return account.balance, sum(r is not None for r in found)
        finally:
            await store.close()

    balance, records = asyncio.run(check())
    assert records == 50
    assert balance == Decimal(10) - 50 * Decimal("0.001")
    assert not list((tmp_path / "g.db.journal").glob("*.jsonl"))
    # A second start finds nothing more to replay, and the balance stays.
    assert asyncio.run(check()) == (balance, 50)


def test_an_idempotency_keys_answer_journaled_with_its_charge_is_kept_by_the_replay(tmp_path: Path) -> None:
    """A process that claimed an Idempotency-Key, journaled the charge and its answer, and died
    before its writer applied them (review: the key was freed with the dead process's claims and a
    retry ran, and was charged, again): the replay charges once and keeps the answer for a retry."""
    db = tmp_path / "g.db"
    account_id = new_account(db)
    journal_and_die(
        db,
        "assert (await store.claim_idempotency('k', 'idem', 'fp', 1, 600_000, 10**13)).outcome == 'run'",
        "answer = StoredAnswer(200, (('content-type', 'audio/mpeg'),), b'\\x00audio\\xff')",
        f"await store.settle(UsageRecord('speech-1', 'r', 'k', {account_id!r}, 'm', 'completed', 10, 0,"
        " Decimal('0.25'), 1, 2), None, KeptAnswer('k', 'idem', 'fp', answer, 10**13))",
        block_writer_at=1,
    )

    async def check() -> None:
        store = await open_store(db)  # replays the orphaned journal
        try:
            claim = await store.claim_idempotency("k", "idem", "fp", 2, 600_000, 10**13)
            assert claim.outcome == "replay", claim
            assert claim.answer is not None and claim.answer.body == b"\x00audio\xff"
            account = await store.find_account("a")
            assert account is not None and account.balance == Decimal("9.75")
        finally:
            await store.close()

    asyncio.run(check())


def test_replay_is_idempotent(tmp_path: Path) -> None:
    async def go() -> Decimal:
        store = await open_store(tmp_path / "g.db")
        account = await store.create_account("a", Decimal(1))
        for i in range(3):
            await store.settle(record(account.id, i))
        await store.close()  # applied and the journal removed
        # The same settlements journaled again by a process that then died:
        directory = store.journal_dir
        stale = Journal(directory)
        for i in range(3):
            stale.append(Settlement(record(account.id, i)))
        stale._file.close()  # dies without applying
        again = await open_store(tmp_path / "g.db")
        try:
            found = await again.find_account("a")
            assert found is not None
            return found.balance
        finally:
            await again.close()

    assert asyncio.run(go()) == Decimal(1) - 3 * Decimal("0.001")


def test_a_journal_appears_under_its_name_only_once_locked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A file under a journal's name that is not locked is a dead owner's: another process's replay
    # would take it. The journal is made and locked under another name first, then renamed.
    seen_while_opening: list[set[str]] = []
    staging_names: list[str] = []

    def opened_then_looked_at(path: Path) -> AppendFile:
        made = AppendFile(path)  # created and locked
        seen_while_opening.append(owners(tmp_path))
        staging_names.append(path.name)
        return made

    monkeypatch.setattr(journal_module, "AppendFile", opened_then_looked_at)
    live = Journal(tmp_path)
    assert seen_while_opening == [set()]
    # Under a name the clean-up of dead makers' staging files knows (remove_dead_staging).
    (staging,) = staging_names
    assert fnmatch.fnmatchcase(staging, journal_module.STAGING_PATTERN)
    assert owners(tmp_path) == {live.owner} and live_count(tmp_path) == 1
    with orphans(tmp_path) as found:
        assert found == []
    live.close()
    assert list(tmp_path.iterdir()) == []


def test_a_dead_maker_staging_file_is_removed_once_old(tmp_path: Path) -> None:
    # A process killed between making its journal and renaming it leaves an empty staging file.
    live = Journal(tmp_path)
    dead = tmp_path / staging_name(f"{journal_module.PREFIX}1-dead{journal_module.SUFFIX}")
    fresh = tmp_path / staging_name(f"{journal_module.PREFIX}2-fresh{journal_module.SUFFIX}")
    being_made = tmp_path / staging_name(f"{journal_module.PREFIX}3-alive{journal_module.SUFFIX}")
    dead.touch()
    fresh.touch()
    held = AppendFile(being_made)  # created and locked: its maker lives
    old = time.time() - journal_module.STAGING_GRACE_SECONDS - 1
    for path in (dead, being_made):
        os.utime(path, (old, old))
    with orphans(tmp_path) as found:
        assert found == []
    # Unlocked but new: its maker may be about to lock it. Locked: its maker is alive.
    assert not dead.exists() and fresh.exists() and being_made.exists() and live.path.exists()
    held.close()
    assert journal_module.remove_dead_staging(tmp_path) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([fresh.name, live.path.name])
    live.close()


def test_a_live_process_journal_is_left_alone(tmp_path: Path) -> None:
    live = Journal(tmp_path)
    live.append(Settlement(record("a", 1)))
    with orphans(tmp_path) as records:
        assert records == []
    assert live.path.exists()
    live.applied(1)
    assert live.path.stat().st_size == 0
    live.close()
    assert not live.path.exists()


@pytest.mark.slow
def test_kill_9_under_load_loses_no_charge(sim_url: str, tmp_path: Path) -> None:
    """Every request that got a successful answer before the gateway was killed has its usage record
    and its charge after a restart; none is charged twice."""
    port = free_port()
    db = tmp_path / "g.db"
    config = tmp_path / "g.toml"
    config.write_text(f'[server]\nport = {port}\n[store]\npath = "{db}"\n' + chat_model("a/m", "m", sim_url))

    async def mint() -> tuple[str, str]:
        store = await open_store(db)
        try:
            account = await store.create_account("a", Decimal(100))
            key = generate_key()
            await store.create_key(account.id, "k", hash_key(key), display_prefix(key), None)
            return key, account.id
        finally:
            await store.close()

    key, _ = asyncio.run(mint())
    answered: dict[str, Decimal] = {}

    async def load(stop_at: float) -> None:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:

            async def worker() -> None:
                while time.monotonic() < stop_at:
                    try:
                        r = await client.post(
                            "/v1/chat/completions",
                            headers={"authorization": f"Bearer {key}"},
                            json={"model": "a/m", "messages": [{"role": "user", "content": "hi"}]},
                        )
                    except httpx.HTTPError:
                        return  # the gateway is gone
                    if r.status_code == 200:
                        answered[r.json()["id"]] = Decimal(r.headers["x-service-cost"])

            await asyncio.gather(*(worker() for _ in range(16)))

    with running(["serve", "--config", str(config)], port) as proc:
        killer = asyncio.new_event_loop()

        def kill_all() -> None:
            for pid in process_tree(proc.pid):
                os.kill(pid, signal.SIGKILL)

        try:
            killer.call_later(1.5, kill_all)
            killer.run_until_complete(load(time.monotonic() + 3))
        finally:
            killer.close()
    assert len(answered) > 50

    with sqlite3.connect(db) as conn:
        dead_leases = conn.execute("SELECT owner FROM leases").fetchall()
    with running(["serve", "--config", str(config)], port):

        async def verify() -> tuple[int, Decimal]:
            store = await open_store(db)
            try:
                found = [await store.get_usage(rid, _key_id(db)) for rid in answered]
                account = await store.find_account("a")
                assert account is not None
                return sum(r is not None for r in found), account.balance
            finally:
                await store.close()

        present, balance = asyncio.run(verify())
    assert present == len(answered)
    # Requests in flight at the kill may have been settled without their answer arriving: charged
    # at most once each, never less than what was answered.
    assert balance <= Decimal(100) - sum(answered.values())
    with sqlite3.connect(db) as conn:
        (count,) = conn.execute("SELECT COUNT(*) FROM usage_records").fetchone()
        total = sum(Decimal(c) for (c,) in conn.execute("SELECT cost FROM usage_records"))
        # The killed process's leases went back when the restart replayed its journal, and the
        # restarted one returned its own when it stopped: no hold is left open.
        leases = conn.execute("SELECT owner, amount FROM leases").fetchall()
    assert balance == Decimal(100) - total
    assert count >= len(answered)
    assert leases == []
    assert dead_leases, "the killed process held leases while it ran"


def _key_id(db: Path) -> str:
    with sqlite3.connect(db) as conn:
        (key_id,) = conn.execute("SELECT id FROM api_keys").fetchone()
    return str(key_id)


def _progress(i: int, completion: int) -> Settlement:
    r = record("a", i)
    return Settlement(
        UsageRecord(
            r.id, r.request_id, r.key_id, r.account_id, r.model, "incomplete", 10, completion, r.cost, 1, 2
        )
    )


def test_a_dead_process_streams_are_billed_their_last_progress(tmp_path: Path) -> None:
    """A stream's progress stands for its settlement only when the settlement never came; the last
    progress wins; a truncation (everything applied) keeps the progress of streams still running."""
    dead = Journal(tmp_path)
    dead.progress(_progress(1, 3))
    dead.progress(_progress(2, 4))
    dead.progress(_progress(1, 7))  # stream 1 went on
    dead.append(Settlement(record("a", 2)))  # stream 2 ended: its settlement, not its progress
    dead.applied(1)  # truncated: only stream 1's latest progress is written again
    dead.progress(_progress(3, 1))
    dead._file.close()  # killed
    with orphans(tmp_path) as found:
        ((orphan,),) = [found]
        by_id = {s.record.id: s.record for s in orphan.settlements}
    assert set(by_id) == {"chatcmpl-1", "chatcmpl-3"}
    assert by_id["chatcmpl-1"].completion_tokens == 7
    assert by_id["chatcmpl-1"].status == "incomplete"
    assert by_id["chatcmpl-3"].completion_tokens == 1


def test_a_stream_that_ended_unbilled_leaves_no_progress(tmp_path: Path) -> None:
    live = Journal(tmp_path)
    live.progress(_progress(1, 3))
    live.forget("chatcmpl-1")
    live.append(Settlement(record("a", 2)))
    live.applied(1)
    assert live.path.stat().st_size == 0
    live.close()
    assert not live.path.exists()


_TEXT = st.text(max_size=20)
_OPTIONAL_TEXT = st.none() | _TEXT


@settings(max_examples=100, deadline=None)
@given(
    log=st.builds(
        RequestLog,
        id=_TEXT,
        key_id=_OPTIONAL_TEXT,
        account_id=_OPTIONAL_TEXT,
        method=_TEXT,
        path=_TEXT,
        model=_OPTIONAL_TEXT,
        status=st.integers(100, 599),
        error_code=_OPTIONAL_TEXT,
        started_at_ms=st.integers(0, 2**53),
        duration_ms=st.integers(0, 2**40),
        cost=st.none() | st.decimals(min_value=0, max_value=10**6, places=9),
        usage_id=_OPTIONAL_TEXT,
        attempts=_OPTIONAL_TEXT,
        request_body=st.none() | st.binary(max_size=20),
        request_bytes=st.integers(0, 2**40),
        response_body=st.none() | st.binary(max_size=20),
        response_bytes=st.integers(0, 2**40),
    ),
    progress=st.booleans(),
)
def test_a_journal_line_reads_back_as_written_without_its_bodies(log: RequestLog, progress: bool) -> None:
    settlement = Settlement(record("acct", 1, "0.000000138"), log)
    line = encode(settlement, progress=progress)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    read, was_progress = decode(line)
    assert was_progress == progress
    assert read == Settlement(settlement.record, replace(log, request_body=None, response_body=None))


def test_a_failed_append_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    """A write that fails part-way (a full disk; here the file-size limit) is cut back, so that the
    next line is not glued to a torn one, which the replay would have to drop."""
    path = tmp_path / "j.jsonl"
    child = "\n".join(
        [
            "import resource, signal",
            "from gateway.core import AppendFile",
            "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)",
            f"f = AppendFile({str(path)!r})",
            "f.append(b'first\\n')",
            "hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]",
            "resource.setrlimit(resource.RLIMIT_FSIZE, (100, hard))",
            "try:",
            "    f.append(b'x' * 500 + b'\\n')",
            "except OSError as exc:",
            "    print('failed', exc)",
            "resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))",
            "f.append(b'second\\n')",
        ]
    )
    out = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, timeout=60, check=False
    )
    assert "failed" in out.stdout, out.stderr
    assert path.read_bytes() == b"first\nsecond\n"


def test_a_journal_that_cannot_be_written_keeps_the_charge_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review: on a full disk a plain request got a 500 and its charge was lost, and a stream
    broke at its first progress mark and was never charged. The settlement is committed all the
    same once the store can write, the request is told its charge is queued (503), a stream's
    progress marks are skipped, and /ready says so."""
    db = tmp_path / "g.db"
    account_id = new_account(db)

    class FullDisk:
        def __init__(self, file: AppendFile) -> None:
            self.file, self.full = file, True

        def append(self, data: bytes) -> None:
            if self.full:
                raise OSError(28, "No space left on device")
            self.file.append(data)

        def __getattr__(self, name: str) -> object:
            return getattr(self.file, name)

    async def main() -> None:
        store = await open_store(db)
        try:
            assert store._journal is not None
            disk = FullDisk(store._journal._file)
            monkeypatch.setattr(store._journal, "_file", disk)
            store.note_progress(record(account_id, 0), log_entry(record(account_id, 0)))  # no raise
            with pytest.raises(ServiceUnavailable) as queued:
                await store.settle(record(account_id, 1))
            assert queued.value.status == 503
            assert "disk cannot be written" in (await store.ready() or "")
            for _ in range(200):
                if await store.get_usage("chatcmpl-1", "key_x") is not None:
                    break
                await asyncio.sleep(0.02)
            assert await store.get_usage("chatcmpl-1", "key_x") is not None
            disk.full = False
            await store.settle(record(account_id, 2))
            assert await store.ready() is None
            for _ in range(200):
                if store._journal._applied == store._journal._written == 2:
                    break
                await asyncio.sleep(0.02)
            assert store._journal._applied == store._journal._written == 2
            assert store._journal.path.stat().st_size == 0  # emptied: everything is in the store
            account = await store.find_account("a")
            assert account is not None and account.balance == Decimal(10) - 2 * Decimal("0.001")
        finally:
            await store.close()

    asyncio.run(main())


def test_a_full_database_is_the_store_away_not_an_unexpected_failure(tmp_path: Path) -> None:
    """Verification review: on a full disk the awaited writes (a response's state, images, a lease,
    an Idempotency-Key claim) failed with sqlite3.OperationalError, answered as an unexpected 500
    without a log entry. They are the store away: ServiceUnavailable, the 503 the routes answer.
    SQLite's max_page_count makes the database full here without a full disk."""
    db = tmp_path / "g.db"
    new_account(db)

    async def main() -> None:
        store = await open_store(db)
        try:
            pages = await store._write(lambda c: c.execute("PRAGMA page_count").fetchone()[0])
            await store._write(lambda c: c.execute(f"PRAGMA max_page_count = {pages}"))
            image = StoredImage("t" * 20, os.urandom(200_000), "image/png", now_ms() + 60_000, "key_x")
            with pytest.raises(ServiceUnavailable):
                await store.put_images([image])
            assert "disk is full" in (await store.ready() or "")
            await store._write(lambda c: c.execute("PRAGMA max_page_count = 1073741823"))
            await store.put_images([image])  # room again
        finally:
            await store.close()

    asyncio.run(main())

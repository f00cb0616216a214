"""The store on PostgreSQL, for any number of gateway instances sharing one database (asyncpg).

Every method is async I/O on a connection pool of this process (`pool_size` connections at most):
nothing blocks the event loop. The schema is migrations/NNNN_*.sql, applied at start (migrate.py).

Money, as on SQLite: exact decimals (`numeric`, Python Decimal), every charge one atomic
`UPDATE accounts SET balance = balance - $1`, a settlement recorded exactly once by its usage id
(`INSERT ... ON CONFLICT DO NOTHING`, charged only when the insert happened), leases granted under
the pot's row lock (`SELECT ... FOR UPDATE`) against what every owner's leases leave free.

Settlements (writer.py): `settle` returns once the charge, the usage record and the log entry have
been handed to the database (written to its connection; the commit follows, and a killed gateway
process cannot stop it), grouped with the other settlements of the moment into one transaction of
one statement (one round trip: gateway_settle, migrations/0002). If the database
is away the settlement stays queued in this process and is retried until it commits; `settle`
waits for that up to SETTLE_WAIT_SECONDS and then raises StoreUnavailable (the request answers 503
rather than succeed without a durable charge), while the settlement still commits when the database
returns: the upstream did the work, so it is charged exactly once. A process killed while the
database is away loses the settlements it had queued (at most those of the outage); with the
database up, none. Log entries and stream progress are queued the same way without waiting.

Liveness and leases: a lease owner is one worker process, with a row in `owners` (this process's
`lease_owner`, registered at start). A task heartbeats it every HEARTBEAT_SECONDS on a dedicated
connection, using the database's clock. An owner whose heartbeat is older than OWNER_TIMEOUT_SECONDS
is dead: `reclaim_orphans`, run by every process's housekeeping every RECLAIM_EVERY *
LEASE_INTERVAL_SECONDS (10 s, gateway.housekeeping), locks the dead owners' rows (FOR UPDATE SKIP
LOCKED, so that two reclaimers never take the same owner) and, in one transaction, applies each
running stream's last progress as an incomplete settlement (only when no settlement with its usage id
exists, as the SQLite journal's replay), deletes its progress, its leases and its row. So a dead
owner's holds return within OWNER_TIMEOUT_SECONDS + the housekeeping reclaim interval: 20 seconds
with the defaults, whatever instance it was on. Jobs hold their money under their own owner
(JOB_LEASE_PREFIX), never reclaimed with a process. A process whose heartbeat was late enough to be
reclaimed (stalled for OWNER_TIMEOUT_SECONDS) registers again under the same name and logs an error:
the leases it thought it had are gone.

Key lookups are cached per process and invalidated across instances within a second (keys.py).

Round trips on the request path: none for a key already cached and a hold its lease covers (the
usual request, gateway.funds); one for its settlement (above); one for a lease that runs short
(gateway_lease, migrations/0002), plus one at most every second to count the live owners; when
no lease can be had, a recall and a read every RECALL_POLL_SECONDS while the other processes answer
(gateway.funds: each looks for recalls of its leases once a second, housekeeping). Pooled
connections go back without the pool's reset query (see _keep_session).

Faults: every method raises StoreUnavailable (errors.py) when the database is out of reach; the
pool replaces broken connections by itself, so calls succeed again as soon as the database is back,
without a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from decimal import Decimal
from typing import Any, Final, TypeVar, cast

import asyncpg
import orjson

from ...budget import period_start_ms
from ...clock import now_ms
from ...loop_failures import outcome_taken
from .. import (
    JOB_RUNNING,
    Account,
    AccountChanges,
    ApiKey,
    IdempotencyClaim,
    IdempotencyKeyReused,
    Job,
    KeptAnswer,
    KeptResponse,
    KeyChanges,
    KeyContext,
    NameTaken,
    RequestLog,
    ResponseState,
    Settlement,
    StoredAnswer,
    StoredImage,
    TopUp,
    UsageRecord,
    leasing,
)
from ..records import (
    JOB_LEASE_PREFIX,
    conversation_turns,
    new_account,
    new_id,
    new_key,
    opening_top_up,
)
from . import rows
from .console import PostgresConsole
from .errors import StoreUnavailable, connects_refused, unavailable
from .keys import CHANNEL, KeyCache
from .migrate import migrate, migrations
from .writer import Writer

T = TypeVar("T")
log = logging.getLogger("gateway.store")

HEARTBEAT_SECONDS = 2.0
OWNER_TIMEOUT_SECONDS = 10.0
# How often the key cache's fallback poll runs while the listening connection is down.
KEY_POLL_SECONDS = 1.0
# How long `settle` waits for its commit while the database is away before raising StoreUnavailable.
SETTLE_WAIT_SECONDS = 5.0
# How long a call waits for a free pooled connection, and a statement for its answer.
ACQUIRE_TIMEOUT_SECONDS = 10.0
# GET /ready waits this long for the database before it says the store is out of reach.
READY_TIMEOUT_SECONDS = 1.0
COMMAND_TIMEOUT_SECONDS = 30.0
# How long close() waits for queued writes while the database is away.
CLOSE_TIMEOUT_SECONDS = 10.0
# A lease granted (and whether this process had to register again): migrations/0002.
_LEASE = (
    "SELECT granted, registered FROM gateway_lease($1::text, $2::text, $3::integer, $4::text, $5::text,"
    " $6::numeric, $7::integer, $8::bigint)"
)
_RUNNING = f"status IN ({', '.join(repr(s) for s in JOB_RUNNING)})"
_FIND_KEY = (
    f"SELECT {', '.join('k.' + c for c in rows.KEY_COLUMNS)},"
    f" {', '.join('a.' + c for c in rows.ACCOUNT_COLUMNS)}"
    " FROM api_keys k JOIN accounts a ON a.id = k.account_id"
    " WHERE k.key_hash = $1 AND k.deleted_at_ms IS NULL"
)
# Bumps the key generation and tells every process to forget its key cache, at commit.
_KEYS_CHANGED = (
    "WITH bump AS (UPDATE key_generation SET generation = generation + 1 WHERE id = 1)"
    f" SELECT pg_notify('{CHANNEL}', '')"
)
_SERVER_SETTINGS = {"application_name": "gateway", "jit": "off"}


async def _keep_session(conn: asyncpg.Connection) -> None:
    """A connection going back to the pool is not reset: the pool's default reset (RESET ALL,
    UNLISTEN *, CLOSE ALL, advisory unlocks) is a round trip after every call, and pooled
    connections never change session state (no SET, LISTEN, cursors or session advisory locks: the
    listener is its own connection, migrations take a transaction's lock). A transaction left open
    is still rolled back by the pool before this runs."""


# Output items of a response an upstream keeps, as their account's ($1 account, $2 ids without
# repeats: one statement may not update a row twice, $3 expiry; a later expiry wins).
_REMEMBER_ITEMS: Final = (
    "INSERT INTO response_items (account_id, item_id, expires_at_ms)"
    " SELECT $1, item, $3 FROM unnest($2::text[]) AS item"
    " ON CONFLICT (account_id, item_id)"
    " DO UPDATE SET expires_at_ms = greatest(response_items.expires_at_ms, excluded.expires_at_ms)"
)


class PostgresStore(PostgresConsole):
    def __init__(self, url: str, pool_size: int = 10) -> None:
        self.url = url
        self.pool_size = pool_size
        self._pool: asyncpg.Pool | None = None
        self._owner = f"proc:{socket.gethostname()}:{os.getpid()}:{os.urandom(4).hex()}"
        self._started = False
        self._writer: Writer | None = None
        self._keys = KeyCache()
        self._control: asyncpg.Connection | None = None
        self._control_task: asyncio.Task[None] | None = None
        self._live: tuple[float, int] = (0.0, 1)  # (monotonic time read, live owners)
        self._lease_epoch = 0  # bumped when this process was reclaimed while alive

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        try:
            # Migrated on a connection of its own: waiting for another instance's migration must
            # not be cut short by the pool's statement timeout.
            conn = await connects_refused(asyncpg.connect(self.url, server_settings=_SERVER_SETTINGS))
            try:
                await migrate(conn)
                settings = dict(_SERVER_SETTINGS)
                if conn.get_server_version().major >= 14:
                    # A statement whose client has gone still runs to its commit, whatever the
                    # server's default: a settlement's caller may have been released (writer.py).
                    settings["client_connection_check_interval"] = "0"
            finally:
                await conn.close()
            self._pool = await asyncpg.create_pool(
                self.url,
                min_size=1,
                max_size=self.pool_size,
                command_timeout=COMMAND_TIMEOUT_SECONDS,
                server_settings=settings,
                reset=_keep_session,
            )
            await self._register()
        except Exception as exc:
            if self._pool is not None:
                await self._pool.close()
                self._pool = None
            if unavailable(exc):
                raise StoreUnavailable(f"PostgreSQL is out of reach: {exc}") from exc
            raise
        self._started = True
        self._writer = Writer(
            lambda: asyncpg.connect(
                self.url,
                server_settings=settings,
                command_timeout=COMMAND_TIMEOUT_SECONDS,
                timeout=ACQUIRE_TIMEOUT_SECONDS,
            ),
            self._owner,
        )
        self._writer.start()
        await self._open_control()
        self._control_task = asyncio.get_running_loop().create_task(
            self._watch(), name="gateway-postgres-heartbeat"
        )

    async def close(self) -> None:
        if self._control_task is not None:
            self._control_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._control_task
            self._control_task = None
        await self._close_control()
        if self._writer is not None:
            await self._writer.close(CLOSE_TIMEOUT_SECONDS)
            self._writer = None
        if self._pool is not None:
            # This process's leases go back with it; the progress of streams that never ended is
            # billed now, as a reclaim would.
            try:
                await self._tx(lambda conn: self._reclaim(conn, [self._owner]))
            except Exception as exc:  # the next reclaim by another process does it
                log.error("returning this process's leases at close failed: %s", exc)
            await self._pool.close()
            self._pool = None
        self._started = False

    @property
    def lease_owner(self) -> str:
        if not self._started:
            raise RuntimeError("store is not started")
        return self._owner

    @property
    def lease_epoch(self) -> int:
        return self._lease_epoch

    # ------------------------------------------------------------------ connections

    @contextlib.asynccontextmanager
    async def _acquire(self) -> AsyncIterator[asyncpg.Connection]:
        """A pooled connection; the driver's connection errors become StoreUnavailable, and so does
        any failure to get one (connects_refused)."""
        if self._pool is None:
            raise RuntimeError("store is not started")
        connected = False
        try:
            async with self._pool.acquire(timeout=ACQUIRE_TIMEOUT_SECONDS) as conn:
                connected = True
                try:
                    yield cast(asyncpg.Connection, conn)  # a proxy with a connection's methods
                except asyncpg.exceptions._base.InternalClientError:
                    # Left mid-operation by a server that went away: never handed out again.
                    conn.terminate()
                    raise
        except StoreUnavailable:
            raise
        except Exception as exc:
            if not connected or unavailable(exc):
                raise StoreUnavailable(f"PostgreSQL is out of reach: {exc}") from exc
            raise

    async def _tx(self, work: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        """Run `work` in a transaction of its own, again when PostgreSQL aborted it for a deadlock
        or a serialization failure (never expected with the lock order of rows.py)."""
        for attempt in range(5):
            try:
                async with self._acquire() as conn, conn.transaction():
                    return await work(conn)
            except asyncpg.TransactionRollbackError:
                if attempt == 4:
                    raise
                await asyncio.sleep(0.01 * (attempt + 1))
        raise AssertionError("unreachable")

    async def _statement(self, sql: str, *args: Any) -> asyncpg.Record:
        """The one row of one statement run as its own transaction (one round trip), again when
        PostgreSQL aborted it for a deadlock or a serialization failure, as `_tx`."""
        for attempt in range(5):
            try:
                async with self._acquire() as conn:
                    row: asyncpg.Record | None = await conn.fetchrow(sql, *args)
                assert row is not None
                return row
            except asyncpg.TransactionRollbackError:
                if attempt == 4:
                    raise
                await asyncio.sleep(0.01 * (attempt + 1))
        raise AssertionError("unreachable")

    async def _caught_up(self) -> None:
        """A read sees this process's settlements, even those whose commit is still under way."""
        if self._writer is not None:
            await self._writer.committed()

    async def _fetchrow(self, sql: str, *args: Any) -> asyncpg.Record | None:
        await self._caught_up()
        async with self._acquire() as conn:
            row: asyncpg.Record | None = await conn.fetchrow(sql, *args)
            return row

    async def _fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        await self._caught_up()
        async with self._acquire() as conn:
            found: list[asyncpg.Record] = await conn.fetch(sql, *args)
            return found

    async def _execute(self, sql: str, *args: Any) -> str:
        async with self._acquire() as conn:
            status: str = await conn.execute(sql, *args)
            return status

    # ------------------------------------------------------------------ liveness

    async def _register(self) -> None:
        async with self._acquire() as conn:
            await conn.execute(
                "INSERT INTO owners (id, host, pid) VALUES ($1, $2, $3)"
                " ON CONFLICT (id) DO UPDATE SET heartbeat_at = now()",
                self._owner,
                socket.gethostname(),
                os.getpid(),
            )

    async def _open_control(self) -> None:
        """The dedicated connection that listens for key changes and carries the heartbeat."""
        try:
            conn = await connects_refused(
                asyncpg.connect(
                    self.url, server_settings=_SERVER_SETTINGS, command_timeout=HEARTBEAT_SECONDS * 2
                )
            )
        except StoreUnavailable as exc:
            log.warning("cannot open the key-change listener (%s); polling instead", exc)
            return
        try:
            await conn.add_listener(CHANNEL, self._on_keys_changed)
        except Exception:
            conn.terminate()
            raise
        self._control = conn
        # Whatever changed while nobody listened is forgotten now.
        self._keys.invalidate()

    async def _close_control(self) -> None:
        conn, self._control = self._control, None
        if conn is not None:
            try:
                await asyncio.wait_for(conn.close(), 2.0)
            except Exception:
                conn.terminate()

    def _on_keys_changed(self, *_: Any) -> None:
        self._keys.invalidate()

    async def _watch(self) -> None:
        """Every KEY_POLL_SECONDS: keep the listener connected (or poll the key generation while it
        is not), and heartbeat every HEARTBEAT_SECONDS."""
        last_beat = time.monotonic()
        while True:
            await asyncio.sleep(KEY_POLL_SECONDS)
            try:
                if self._control is None or self._control.is_closed():
                    await self._close_control()
                    await self._open_control()
                beat = time.monotonic() - last_beat >= HEARTBEAT_SECONDS - KEY_POLL_SECONDS / 2
                if beat:
                    await self._heartbeat()
                    last_beat = time.monotonic()
                elif self._control is None:
                    async with self._acquire() as conn:
                        self._keys.observe(await conn.fetchval("SELECT generation FROM key_generation"))
            except Exception as exc:
                log.warning("store heartbeat or key watch failed: %s", exc)
                if self._control is not None and not unavailable(exc):
                    continue
                await self._close_control()

    async def _heartbeat(self) -> None:
        beat = (
            "WITH u AS (UPDATE owners SET heartbeat_at = now() WHERE id = $1 RETURNING 1)"
            " SELECT (SELECT generation FROM key_generation), EXISTS (SELECT 1 FROM u)"
        )
        if self._control is not None:
            row = await self._control.fetchrow(beat, self._owner)
        else:
            async with self._acquire() as conn:
                row = await conn.fetchrow(beat, self._owner)
        assert row is not None
        self._keys.observe(row[0])
        if not row[1]:
            log.error(
                "this process's heartbeat was late enough for it to be reclaimed as dead: its leases"
                " were returned; registering again"
            )
            self._lease_epoch += 1
            await self._register()

    async def live_owners(self) -> int:
        """How many lease owners (worker processes of every instance) have a fresh heartbeat; at
        least 1. Read at most once a second."""
        read_at, live = self._live
        if time.monotonic() - read_at < 1.0:
            return live
        async with self._acquire() as conn:
            found = await conn.fetchval(
                "SELECT count(*) FROM owners WHERE heartbeat_at >= now() - make_interval(secs => $1)",
                OWNER_TIMEOUT_SECONDS,
            )
        live = max(1, int(found))
        self._live = (time.monotonic(), live)
        return live

    async def reclaim_orphans(self) -> int:
        async def reclaim(conn: asyncpg.Connection) -> int:
            dead = [
                row[0]
                for row in await conn.fetch(
                    "SELECT id FROM owners WHERE heartbeat_at < now() - make_interval(secs => $1)"
                    " FOR UPDATE SKIP LOCKED",
                    OWNER_TIMEOUT_SECONDS,
                )
            ]
            return await self._reclaim(conn, dead)

        return await self._tx(reclaim)

    async def _reclaim(self, conn: asyncpg.Connection, owners: list[str]) -> int:
        """In the caller's transaction, with `owners`' rows locked (or gone): bill their streams'
        last progress where no settlement came, and delete their progress, leases, running
        Idempotency-Key claims and rows; also what any owner without a row left (never expected).
        Returns how many settlements were new."""
        found = await conn.fetch(
            "DELETE FROM stream_progress AS p WHERE p.owner = ANY($1::text[])"
            " OR NOT EXISTS (SELECT 1 FROM owners o WHERE o.id = p.owner) RETURNING p.settlement",
            owners,
        )
        applied = await rows.settle_many(conn, _decoded_progress(row[0] for row in found), None)
        leases = rows.count(
            await conn.execute(
                "DELETE FROM leases AS l WHERE l.owner = ANY($1::text[])"
                " OR (l.owner NOT LIKE $2 AND NOT EXISTS (SELECT 1 FROM owners o WHERE o.id = l.owner))",
                owners,
                JOB_LEASE_PREFIX + "%",
            )
        )
        # Their requests run no more: an Idempotency-Key one of them held is free for a retry.
        await conn.execute(
            "DELETE FROM idempotency WHERE state = 'running' AND owner = ANY($1::text[])", owners
        )
        await conn.execute("DELETE FROM owners WHERE id = ANY($1::text[])", owners)
        others = [owner for owner in owners if owner != self._owner]
        if not others and not applied:
            # This process's own stop giving its leases back: routine, not an incident.
            if leases:
                log.info("returned this process's %d leases", leases)
        else:
            log.warning(
                "reclaimed %d stopped processes: %d stream settlements applied (%d new), %d leases returned",
                len(others),
                len(found),
                applied,
                leases,
            )
        return applied

    # ------------------------------------------------------------------ keys

    async def find_key(self, key_hash: bytes) -> KeyContext | None:
        ctx = self._keys.get(key_hash)
        if ctx is not None:
            return ctx
        generation = self._keys.generation  # an invalidation from now on drops what is read
        row = await self._fetchrow(_FIND_KEY, key_hash)
        if row is None:
            return None
        split = len(rows.KEY_COLUMNS)
        ctx = KeyContext(key=rows.key(row[:split]), account=rows.account(row[split:]))
        self._keys.put(key_hash, ctx, generation)
        return ctx

    async def _change_keys(self, work: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        """A change to keys or accounts: every process forgets its key cache once it commits."""

        async def run(conn: asyncpg.Connection) -> T:
            result = await work(conn)
            await conn.execute(_KEYS_CHANGED)
            return result

        try:
            return await self._tx(run)
        finally:
            self._keys.invalidate()

    # ------------------------------------------------------------------ settlements and logs

    def _writer_or_fail(self) -> Writer:
        if self._writer is None:
            raise RuntimeError("store is not started")
        return self._writer

    async def settle(
        self, record: UsageRecord, entry: RequestLog | None = None, answer: KeptAnswer | None = None
    ) -> None:
        """Store the usage record and the request's log entry and charge its cost, atomically and
        exactly once, taking the cost off this process's leases too, and keep `answer` in the same
        statement; returns once handed to the database (writer.py: its commit follows whatever
        happens to this process; reads of this process wait for it). StoreUnavailable when it could
        not be handed over within SETTLE_WAIT_SECONDS: it stays queued and commits when the
        database is back."""
        future = await self._writer_or_fail().settle(Settlement(record, entry, answer))
        if future.done():  # handed over already, the usual case: no timer to set up
            return future.result()
        try:
            await asyncio.wait_for(asyncio.shield(future), SETTLE_WAIT_SECONDS)
        except TimeoutError:
            raise StoreUnavailable(
                "PostgreSQL is out of reach: the charge is queued and commits when it is back"
            ) from None

    def note_progress(self, record: UsageRecord, entry: RequestLog) -> None:
        self._writer_or_fail().progress(Settlement(record, entry))

    def forget_progress(self, usage_id: str) -> None:
        if self._writer is not None:
            self._writer.forget(usage_id)

    def log_request(self, entry: RequestLog) -> None:
        self._writer_or_fail().log(entry)

    async def account_usages(self, account_id: str, usage_ids: Sequence[str]) -> list[UsageRecord]:
        wanted = list(dict.fromkeys(usage_ids))[:1000]
        if not wanted:
            return []
        found = await self._fetch(
            f"SELECT {rows.USAGE} FROM usage_records WHERE id = ANY($1::text[]) AND account_id = $2",
            wanted,
            account_id,
        )
        return [rows.usage(row) for row in found]

    def follow_load(self, running: Callable[[], int]) -> None:
        # Nothing to pace: the database's work is done by its own processes, not on this process's
        # core, and under load each commit already carries what queued during the one before.
        pass

    async def get_usage(self, usage_id: str, key_id: str) -> UsageRecord | None:
        row = await self._fetchrow(
            f"SELECT {rows.USAGE} FROM usage_records WHERE id = $1 AND key_id = $2", usage_id, key_id
        )
        return None if row is None else rows.usage(row)

    async def get_request_log(self, log_id: str) -> RequestLog | None:
        row = await self._fetchrow(f"SELECT {rows.LOG} FROM request_logs WHERE id = $1", log_id)
        return None if row is None else rows.request_log(row)

    async def purge_log_bodies(self, before_ms: int) -> int:
        return rows.count(
            await self._execute(
                "UPDATE request_logs SET request_body = NULL, response_body = NULL"
                " WHERE started_at_ms < $1 AND (request_body IS NOT NULL OR response_body IS NOT NULL)",
                before_ms,
            )
        )

    # ------------------------------------------------------------------ leases

    async def lease(self, kind: str, pot_id: str, need: Decimal, share: int, now_ms: int) -> Decimal:
        """One round trip (gateway_lease, migrations/0002): the owner's row held, the pot locked,
        `need` and a `share`-th part of what is left free granted (whole nano-dollars)."""
        if kind not in ("account", "key"):
            raise ValueError(f"unknown pot kind {kind!r}")
        granted, registered = await self._statement(
            _LEASE, self.lease_owner, socket.gethostname(), os.getpid(), kind, pot_id, need, share, now_ms
        )
        if registered:
            log.error("this process was reclaimed as dead while alive; registered again")
            self._lease_epoch += 1
        result: Decimal = granted
        return result

    async def return_lease(self, kind: str, pot_id: str, amount: Decimal) -> None:
        owner = self.lease_owner

        async def give_back(conn: asyncpg.Connection) -> None:
            await rows.lock_pot(conn, kind, pot_id)
            await rows.add_to_lease(conn, kind, pot_id, owner, -amount)

        await self._tx(give_back)

    async def free(self, kind: str, pot_id: str, now_ms: int) -> Decimal | None:
        async with self._acquire() as conn:
            return await rows.free(conn, kind, pot_id, now_ms, lock=False)

    async def recall(self, kind: str, pot_id: str) -> Decimal:
        owner = self.lease_owner

        async def ask(conn: asyncpg.Connection) -> Decimal:
            await rows.lock_pot(conn, kind, pot_id)  # the lock order of every change to its leases
            leased: Decimal = await conn.fetchval(
                "WITH asked AS (UPDATE leases SET recalled = true WHERE kind = $1 AND pot_id = $2"
                " AND owner <> $3 AND owner NOT LIKE $4 RETURNING amount)"  # a job's lease is all held
                " SELECT coalesce(sum(amount), 0) FROM asked",
                kind,
                pot_id,
                owner,
                JOB_LEASE_PREFIX + "%",
            )
            return leased

        return await self._tx(ask)

    async def recalls(self) -> list[tuple[str, str]]:
        # Not behind this process's own settlements (_fetch would wait for its writer): a recall
        # does not depend on them, and a writer held up must not hold the answer up.
        async with self._acquire() as conn:
            found = await conn.fetch(
                "SELECT kind, pot_id FROM leases WHERE owner = $1 AND recalled", self.lease_owner
            )
        return [(kind, pot_id) for kind, pot_id in found]

    async def answer_recall(self, kind: str, pot_id: str, amount: Decimal) -> None:
        owner = self.lease_owner

        async def answer(conn: asyncpg.Connection) -> None:
            await rows.lock_pot(conn, kind, pot_id)
            await conn.execute(
                "UPDATE leases SET recalled = false WHERE kind = $1 AND pot_id = $2 AND owner = $3",
                kind,
                pot_id,
                owner,
            )
            await rows.add_to_lease(conn, kind, pot_id, owner, -amount)

        await self._tx(answer)

    async def recall_pending(self, kind: str, pot_id: str) -> bool:
        row = await self._statement(
            "SELECT EXISTS (SELECT 1 FROM leases WHERE kind = $1 AND pot_id = $2 AND recalled)", kind, pot_id
        )
        pending: bool = row[0]
        return pending

    # ------------------------------------------------------------------ images and response states

    async def put_images(self, images: Sequence[StoredImage]) -> None:
        async def put(conn: asyncpg.Connection) -> None:
            await conn.executemany(
                "INSERT INTO images (token, key_id, content_type, expires_at_ms, data)"
                " VALUES ($1, $2, $3, $4, $5)",
                [(i.token, i.key_id, i.content_type, i.expires_at_ms, i.data) for i in images],
            )

        await self._tx(put)

    async def get_image(self, token: str) -> StoredImage | None:
        row = await self._fetchrow(
            "SELECT token, data, content_type, expires_at_ms, key_id FROM images WHERE token = $1", token
        )
        return None if row is None else StoredImage(*row)

    async def purge_images(self, now_ms: int) -> int:
        return rows.count(await self._execute("DELETE FROM images WHERE expires_at_ms <= $1", now_ms))

    async def remember_response(self, state: ResponseState) -> None:
        async def work(conn: asyncpg.Connection) -> None:
            await conn.execute(
                "INSERT INTO response_states"
                " (id, account_id, model, channel_url, upstream_id, expires_at_ms, context_tokens)"
                " VALUES ($1, $2, $3, $4, $5, $6, $7)"
                " ON CONFLICT (id) DO UPDATE SET account_id = excluded.account_id, model = excluded.model,"
                " channel_url = excluded.channel_url, upstream_id = excluded.upstream_id,"
                " expires_at_ms = excluded.expires_at_ms, context_tokens = excluded.context_tokens",
                state.id,
                state.account_id,
                state.model,
                state.channel_url,
                state.upstream_id,
                state.expires_at_ms,
                state.context_tokens,
            )
            if state.item_ids:
                await conn.execute(
                    _REMEMBER_ITEMS,
                    state.account_id,
                    list(dict.fromkeys(state.item_ids)),
                    state.expires_at_ms,
                )

        await self._tx(work)

    async def forget_response(self, response_id: str, account_id: str) -> bool:
        forgotten = await self._execute(
            "DELETE FROM response_states WHERE id = $1 AND account_id = $2", response_id, account_id
        )
        return rows.count(forgotten) > 0

    async def find_response(self, response_id: str, account_id: str, now_ms: int) -> ResponseState | None:
        row = await self._fetchrow(
            "SELECT id, account_id, model, channel_url, upstream_id, expires_at_ms, context_tokens"
            " FROM response_states WHERE id = $1 AND account_id = $2 AND expires_at_ms > $3",
            response_id,
            account_id,
            now_ms,
        )
        return None if row is None else ResponseState(*row)

    async def gateway_response_id(
        self, upstream_id: str, channel_url: str, account_id: str, now_ms: int
    ) -> str | None:
        row = await self._fetchrow(
            "SELECT id FROM response_states WHERE upstream_id = $1 AND channel_url = $2"
            " AND account_id = $3 AND expires_at_ms > $4",
            upstream_id,
            channel_url,
            account_id,
            now_ms,
        )
        return None if row is None else str(row[0])

    async def keep_response(
        self, kept: KeptResponse, expires_at_ms: int, touches: Sequence[str] = ()
    ) -> None:
        async def work(conn: asyncpg.Connection) -> None:
            conversation = await conn.fetchval(
                "INSERT INTO kept_responses"
                " (id, account_id, model, previous_id, conversation_id, items, body)"
                " VALUES ($1, $2, $3, $4::text, COALESCE((SELECT conversation_id FROM kept_responses"
                " WHERE id = $4::text), $1), $5, $6) RETURNING conversation_id",
                kept.id,
                kept.account_id,
                kept.model,
                kept.previous_id,
                kept.items,
                kept.body,
            )
            await conn.execute(
                "INSERT INTO kept_conversations (id, expires_at_ms) VALUES ($1, $2) ON CONFLICT (id)"
                " DO UPDATE SET expires_at_ms"
                " = GREATEST(kept_conversations.expires_at_ms, excluded.expires_at_ms)",
                conversation,
                expires_at_ms,
            )
            if touches:
                await conn.execute(
                    "UPDATE kept_conversations SET expires_at_ms = GREATEST(expires_at_ms, $1) WHERE id IN"
                    " (SELECT conversation_id FROM kept_responses WHERE id = ANY($2::text[]))",
                    expires_at_ms,
                    list(touches),
                )

        await self._tx(work)

    async def find_kept_response(self, response_id: str, account_id: str, now_ms: int) -> KeptResponse | None:
        row = await self._fetchrow(
            "SELECT r.id, r.account_id, r.model, r.previous_id, r.items, r.body FROM kept_responses r"
            " JOIN kept_conversations c ON c.id = r.conversation_id"
            " WHERE r.id = $1 AND r.account_id = $2 AND c.expires_at_ms > $3",
            response_id,
            account_id,
            now_ms,
        )
        return None if row is None else KeptResponse(*row)

    async def kept_conversation(
        self, response_id: str, account_id: str, now_ms: int, max_bytes: int
    ) -> list[bytes] | None:
        found = await self._fetch(
            "WITH RECURSIVE turn(id, previous_id, items, total, depth) AS ("
            " SELECT r.id, r.previous_id, r.items, octet_length(r.items)::bigint, 0 FROM kept_responses r"
            " JOIN kept_conversations c ON c.id = r.conversation_id"
            " WHERE r.id = $1 AND r.account_id = $2 AND c.expires_at_ms > $3"
            " UNION ALL SELECT k.id, k.previous_id, k.items, turn.total + octet_length(k.items),"
            " turn.depth + 1 FROM kept_responses k JOIN turn ON k.id = turn.previous_id"
            " WHERE k.account_id = $2 AND turn.total <= $4)"
            " SELECT items, previous_id, total FROM turn ORDER BY depth DESC",
            response_id,
            account_id,
            now_ms,
            max_bytes,
        )
        return conversation_turns([tuple(row) for row in found], max_bytes)

    async def delete_kept_response(self, response_id: str, account_id: str) -> bool:
        deleted = await self._execute(
            "DELETE FROM kept_responses WHERE id = $1 AND account_id = $2", response_id, account_id
        )
        return rows.count(deleted) > 0

    async def kept_items(self, response_ids: Sequence[str], account_id: str, now_ms: int) -> dict[str, bytes]:
        if not response_ids:
            return {}
        found = await self._fetch(
            "SELECT r.id, r.items FROM kept_responses r JOIN kept_conversations c ON c.id = r.conversation_id"
            " WHERE r.id = ANY($1::text[]) AND r.account_id = $2 AND c.expires_at_ms > $3",
            list(response_ids),
            account_id,
            now_ms,
        )
        return {row[0]: row[1] for row in found}

    async def remember_items(self, account_id: str, item_ids: Sequence[str], expires_at_ms: int) -> None:
        if item_ids:
            await self._execute(_REMEMBER_ITEMS, account_id, list(dict.fromkeys(item_ids)), expires_at_ms)

    async def known_items(self, account_id: str, item_ids: Sequence[str], now_ms: int) -> set[str]:
        if not item_ids:
            return set()
        found = await self._fetch(
            "SELECT item_id FROM response_items"
            " WHERE account_id = $1 AND item_id = ANY($2::text[]) AND expires_at_ms > $3",
            account_id,
            list(item_ids),
            now_ms,
        )
        return {row[0] for row in found}

    async def purge_responses(self, now_ms: int) -> int:
        async def work(conn: asyncpg.Connection) -> int:
            kept = await conn.execute(
                "DELETE FROM kept_responses WHERE conversation_id IN"
                " (SELECT id FROM kept_conversations WHERE expires_at_ms <= $1)",
                now_ms,
            )
            await conn.execute("DELETE FROM kept_conversations WHERE expires_at_ms <= $1", now_ms)
            items = await conn.execute("DELETE FROM response_items WHERE expires_at_ms <= $1", now_ms)
            return rows.count(kept) + rows.count(items)

        kept = await self._tx(work)
        return kept + rows.count(
            await self._execute("DELETE FROM response_states WHERE expires_at_ms <= $1", now_ms)
        )

    # ------------------------------------------------------------------ jobs

    async def create_job(
        self, job: Job, pots: Sequence[tuple[str, str]], answer: KeptAnswer | None = None
    ) -> None:
        owner = self.lease_owner

        async def create(conn: asyncpg.Connection) -> None:
            await conn.execute(
                f"INSERT INTO jobs ({rows.JOB}, next_poll_at_ms)"
                f" VALUES ({rows.marks(len(rows.JOB_COLUMNS) + 1)})",
                *rows.job_values(job),
                job.created_at_ms,
            )
            for kind, pot_id in sorted(pots):  # accounts before keys: the lock order
                await rows.lock_pot(conn, kind, pot_id)
                await rows.add_to_lease(conn, kind, pot_id, owner, -job.hold)
                await rows.add_to_lease(conn, kind, pot_id, JOB_LEASE_PREFIX + job.id, job.hold)
            if answer is not None:
                await conn.fetchval(rows.KEEP_ANSWERS, rows.answers_arg([answer]))

        await self._tx(create)

    async def claim_jobs(self, now_ms: int, lease_ms: int, limit: int) -> list[Job]:
        found = await self._fetch(
            f"WITH due AS (SELECT id FROM jobs WHERE {_RUNNING} AND next_poll_at_ms <= $1"
            " AND lease_until_ms <= $1 ORDER BY next_poll_at_ms LIMIT $3 FOR UPDATE SKIP LOCKED)"
            f" UPDATE jobs SET lease_until_ms = $1 + $2 FROM due WHERE jobs.id = due.id"
            f" RETURNING {', '.join('jobs.' + c for c in rows.JOB_COLUMNS)}, jobs.next_poll_at_ms",
            now_ms,
            lease_ms,
            limit,
        )
        found.sort(key=lambda row: (row[-1], row[0]))
        return [rows.job(row[:-1]) for row in found]

    async def release_jobs(self, job_ids: Sequence[str]) -> None:
        if job_ids:
            await self._execute(
                f"UPDATE jobs SET lease_until_ms = 0 WHERE id = ANY($1::text[]) AND {_RUNNING}", list(job_ids)
            )

    async def note_job_progress(
        self, job_id: str, status: str, progress: int, next_poll_at_ms: int, body: bytes | None = None
    ) -> None:
        await self._execute(
            "UPDATE jobs SET status = $1, progress = $2, next_poll_at_ms = $3, lease_until_ms = 0,"
            f" body = coalesce($4, body) WHERE id = $5 AND {_RUNNING}",
            status,
            progress,
            next_poll_at_ms,
            body,
            job_id,
        )

    async def finish_job(
        self,
        job_id: str,
        status: str,
        *,
        error: str | None,
        record: UsageRecord | None,
        now_ms: int,
        body: bytes | None = None,
        content: bytes | None = None,
        content_type: str | None = None,
        ttl_ms: int = 0,
    ) -> bool:
        async def finish(conn: asyncpg.Connection) -> bool:
            ended = await conn.fetchrow(
                "UPDATE jobs SET status = $1, progress = $2, completed_at_ms = $3, expires_at_ms = $4,"
                " error = $5, cost = $6, body = coalesce($7, body), lease_until_ms = 0"
                f" WHERE id = $8 AND {_RUNNING} RETURNING account_id, key_id",
                status,
                100 if status == "completed" else 0,
                now_ms,
                None if content is None else now_ms + ttl_ms,
                error,
                None if record is None else record.cost,
                body,
                job_id,
            )
            if ended is None:
                return False
            # The job's pots, locked in the order every money transaction takes them.
            await rows.lock_pot(conn, "account", ended[0])
            await rows.lock_pot(conn, "key", ended[1])
            if record is not None:
                await rows.settle_many(conn, [Settlement(record)], None)
                # The request that created the job shows its charge in its log entry from now on.
                await conn.execute(
                    "UPDATE request_logs SET cost = $1, usage_id = $2 WHERE id = $3",
                    record.cost,
                    record.id,
                    record.request_id,
                )
            if content is not None:
                await conn.execute(
                    "INSERT INTO video_files (job_id, content_type, expires_at_ms, data)"
                    " VALUES ($1, $2, $3, $4)"
                    " ON CONFLICT (job_id) DO UPDATE SET content_type = excluded.content_type,"
                    " expires_at_ms = excluded.expires_at_ms, data = excluded.data",
                    job_id,
                    content_type or "video/mp4",
                    now_ms + ttl_ms,
                    content,
                )
            await conn.execute("DELETE FROM leases WHERE owner = $1", JOB_LEASE_PREFIX + job_id)
            return True

        return await self._tx(finish)

    async def get_job(self, job_id: str, key_id: str, kind: str) -> Job | None:
        row = await self._fetchrow(
            f"SELECT {rows.JOB} FROM jobs WHERE id = $1 AND key_id = $2 AND kind = $3", job_id, key_id, kind
        )
        return None if row is None else rows.job(row)

    async def job_key(self, job_id: str, account_id: str, kind: str) -> str | None:
        row = await self._fetchrow(
            "SELECT key_id FROM jobs WHERE id = $1 AND account_id = $2 AND kind = $3",
            job_id,
            account_id,
            kind,
        )
        return None if row is None else str(row[0])

    async def job_counts(self) -> dict[tuple[str, str], int]:
        found = await self._fetch("SELECT kind, status, count(*) FROM jobs GROUP BY kind, status")
        return {(row[0], row[1]): row[2] for row in found}

    async def ready(self) -> str | None:
        if self._pool is None:
            return "the store has not started"
        needed = len(migrations())
        try:
            version = await self._schema_version()
        except Exception as exc:  # whatever it is, the store cannot serve: say so, never raise
            return f"PostgreSQL is out of reach: {type(exc).__name__}: {exc}"
        if version is None or version < needed:
            return f"the PostgreSQL schema is at version {version or 0}, the gateway needs {needed}"
        failing = None if self._writer is None else self._writer.failing
        if failing is not None:
            return f"writes to PostgreSQL have failed for {failing:.0f} s"
        return None

    async def _schema_version(self) -> int | None:
        """ready()'s query, answered within READY_TIMEOUT_SECONDS or TimeoutError. A query still
        running then is not cancelled but its connection closed at once: a cancelled one was
        waited for as its connection went back to the pool (asyncpg waits for the cancellation), 30
        s on a database that never answers (outage review); and a probe shares nothing with the
        one before, so the first after the database's return says so."""
        assert self._pool is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + READY_TIMEOUT_SECONDS
        async with asyncio.timeout_at(deadline):
            conn = await self._pool.acquire()
        query = asyncio.ensure_future(conn.fetchval("SELECT max(version) FROM schema_migrations"))
        try:
            await asyncio.wait({query}, timeout=max(deadline - loop.time(), 0.0))
        finally:
            if not query.done():
                conn.terminate()
                query.add_done_callback(outcome_taken)
            await self._pool.release(conn)
        if not query.done():
            raise TimeoutError(f"no answer within {READY_TIMEOUT_SECONDS:g} s")
        version: int | None = query.result()
        return version

    async def list_jobs(
        self, key_id: str, kind: str, *, after: str | None, limit: int, newest_first: bool
    ) -> list[Job]:
        order, beyond = ("DESC", "<") if newest_first else ("ASC", ">")
        where, args = "key_id = $1 AND kind = $2", [key_id, kind]
        if after is not None:
            # Creation time, then id for jobs created in the same millisecond.
            where += (
                f" AND (created_at_ms, id) {beyond}"
                " (SELECT created_at_ms, id FROM jobs WHERE id = $3 AND key_id = $1)"
            )
            args.append(after)
        found = await self._fetch(
            f"SELECT {rows.JOB} FROM jobs WHERE {where} ORDER BY created_at_ms {order}, id {order}"
            f" LIMIT ${len(args) + 1}",
            *args,
            limit,
        )
        return [rows.job(row) for row in found]

    async def get_video_content(self, job_id: str, key_id: str, now_ms: int) -> tuple[bytes, str] | None:
        row = await self._fetchrow(
            "SELECT f.data, f.content_type FROM video_files f JOIN jobs j ON j.id = f.job_id"
            " WHERE f.job_id = $1 AND j.key_id = $2 AND f.expires_at_ms > $3",
            job_id,
            key_id,
            now_ms,
        )
        return None if row is None else (row[0], row[1])

    async def purge_video_files(self, now_ms: int) -> int:
        return rows.count(await self._execute("DELETE FROM video_files WHERE expires_at_ms <= $1", now_ms))

    # ------------------------------------------------------------------ idempotency

    async def claim_idempotency(
        self, key_id: str, idempotency_key: str, fingerprint: str, now_ms: int, lease_ms: int, ttl_ms: int
    ) -> IdempotencyClaim:
        async def claim(conn: asyncpg.Connection) -> IdempotencyClaim:
            while True:
                taken = await conn.fetchval(
                    "INSERT INTO idempotency (key_id, idempotency_key, fingerprint, state, lease_until_ms,"
                    " expires_at_ms, owner) VALUES ($1, $2, $3, 'running', $4, $5, $6)"
                    " ON CONFLICT (key_id, idempotency_key) DO NOTHING RETURNING 1",
                    key_id,
                    idempotency_key,
                    fingerprint,
                    now_ms + lease_ms,
                    now_ms + ttl_ms,
                    self._owner,
                )
                if taken is not None:
                    return IdempotencyClaim("run")
                row = await conn.fetchrow(
                    "SELECT fingerprint, state, lease_until_ms, expires_at_ms, status, headers, body"
                    " FROM idempotency WHERE key_id = $1 AND idempotency_key = $2 FOR UPDATE",
                    key_id,
                    idempotency_key,
                )
                if row is None:  # deleted since the insert saw it: try again
                    continue
                kept, state, lease_until, expires_at, status, headers, body = row
                live = lease_until > now_ms if state == "running" else expires_at > now_ms
                if live and kept != fingerprint:
                    return IdempotencyClaim("reused")
                if live and state == "running":
                    return IdempotencyClaim("in_progress")
                if live:
                    pairs = tuple((str(k), str(v)) for k, v in orjson.loads(headers))
                    return IdempotencyClaim("replay", StoredAnswer(status, pairs, body))
                # Expired, or held by a request whose lease ran out (its process died): take it.
                await conn.execute(
                    "UPDATE idempotency SET fingerprint = $3, state = 'running', lease_until_ms = $4,"
                    " expires_at_ms = $5, status = NULL, headers = NULL, body = NULL, owner = $6"
                    " WHERE key_id = $1 AND idempotency_key = $2",
                    key_id,
                    idempotency_key,
                    fingerprint,
                    now_ms + lease_ms,
                    now_ms + ttl_ms,
                    self._owner,
                )
                return IdempotencyClaim("run")

        return await self._tx(claim)

    async def finish_idempotency(
        self,
        key_id: str,
        idempotency_key: str,
        fingerprint: str,
        answer: StoredAnswer | None,
        now_ms: int,
        ttl_ms: int,
    ) -> None:
        if answer is None:
            await self._execute(
                "DELETE FROM idempotency WHERE key_id = $1 AND idempotency_key = $2 AND fingerprint = $3"
                " AND state = 'running'",
                key_id,
                idempotency_key,
                fingerprint,
            )
            return
        kept = KeptAnswer(key_id, idempotency_key, fingerprint, answer, now_ms + ttl_ms)
        await self._execute(rows.KEEP_ANSWERS, rows.answers_arg([kept]))

    async def purge_idempotency(self, now_ms: int) -> int:
        return rows.count(await self._execute("DELETE FROM idempotency WHERE expires_at_ms <= $1", now_ms))

    # ------------------------------------------------------------------ accounts

    async def create_account(
        self,
        name: str,
        balance: Decimal,
        *,
        allowed_models: frozenset[str] | None = None,
        rpm_limit: int | None = None,
        tpm_limit: int | None = None,
    ) -> Account:
        account = new_account(name, balance, allowed_models, rpm_limit, tpm_limit)

        async def create(conn: asyncpg.Connection) -> None:
            await conn.execute(
                f"INSERT INTO accounts ({rows.ACCOUNT}) VALUES ({rows.marks(len(rows.ACCOUNT_COLUMNS))})",
                account.id,
                name,
                balance,
                rows.models_value(allowed_models),
                rpm_limit,
                tpm_limit,
                account.created_at_ms,
            )
            if balance:
                opening = opening_top_up(account)
                await conn.execute(
                    f"INSERT INTO top_ups ({rows.TOP_UP}) VALUES ($1, $2, $3, $4, $5, $6)",
                    opening.id,
                    account.id,
                    opening.amount,
                    opening.note,
                    opening.created_at_ms,
                    opening.balance_after,
                )

        with _unique_name(name):
            await self._tx(create)
        return account

    async def find_account(self, name: str) -> Account | None:
        row = await self._fetchrow(f"SELECT {rows.ACCOUNT} FROM accounts WHERE name = $1", name)
        return None if row is None else rows.account(row)

    async def get_account(self, account_id: str) -> Account | None:
        row = await self._fetchrow(f"SELECT {rows.ACCOUNT} FROM accounts WHERE id = $1", account_id)
        return None if row is None else rows.account(row)

    async def list_accounts(self, *, after: str | None = None, limit: int | None = None) -> list[Account]:
        return [rows.account(row) for row in await self._page("accounts", rows.ACCOUNT, None, after, limit)]

    async def update_account(self, account_id: str, changes: AccountChanges) -> Account | None:
        values: dict[str, Any] = {c: changes[c] for c in _ACCOUNT_CHANGES if c in changes}  # type: ignore[literal-required]
        if "allowed_models" in values:
            values["allowed_models"] = rows.models_value(values["allowed_models"])

        async def update(conn: asyncpg.Connection) -> Account | None:
            if values:
                await conn.execute(
                    f"UPDATE accounts SET {_assignments(values)} WHERE id = $1", account_id, *values.values()
                )
            row = await conn.fetchrow(f"SELECT {rows.ACCOUNT} FROM accounts WHERE id = $1", account_id)
            return None if row is None else rows.account(row)

        with _unique_name(changes.get("name", "")):
            return await self._change_keys(update)

    async def top_up(
        self, account_id: str, amount: Decimal, note: str | None, idempotency_key: str | None = None
    ) -> tuple[TopUp, bool] | None:
        async def add(conn: asyncpg.Connection) -> tuple[TopUp, bool] | None:
            # The account's row lock serialises its top-ups (the idempotency check included) with
            # every charge; the balance changes by one atomic addition.
            if await rows.lock_pot(conn, "account", account_id) is None:
                return None
            if idempotency_key is not None:
                earlier = await conn.fetchrow(
                    f"SELECT {rows.TOP_UP} FROM top_ups WHERE account_id = $1 AND idempotency_key = $2",
                    account_id,
                    idempotency_key,
                )
                if earlier is not None:
                    entry = rows.top_up(earlier)
                    if (entry.amount, entry.note) != (amount, note):
                        raise IdempotencyKeyReused(idempotency_key)
                    return entry, True
            balance = await conn.fetchval(
                "UPDATE accounts SET balance = balance + $1 WHERE id = $2 RETURNING balance",
                amount,
                account_id,
            )
            entry = TopUp(
                id=new_id("topup_"),
                account_id=account_id,
                amount=amount,
                note=note,
                created_at_ms=now_ms(),
                balance_after=balance,
            )
            await conn.execute(
                f"INSERT INTO top_ups ({rows.TOP_UP}, idempotency_key) VALUES ($1, $2, $3, $4, $5, $6, $7)",
                entry.id,
                account_id,
                amount,
                note,
                entry.created_at_ms,
                balance,
                idempotency_key,
            )
            return entry, False

        return await self._tx(add)

    async def list_top_ups(
        self, account_id: str, *, after: str | None = None, limit: int | None = None
    ) -> list[TopUp]:
        return [
            rows.top_up(row) for row in await self._page("top_ups", rows.TOP_UP, account_id, after, limit)
        ]

    async def _page(
        self, table: str, columns: str, account_id: str | None, after: str | None, limit: int | None
    ) -> list[asyncpg.Record]:
        """Rows in the order they were made, optionally of one account, from the one after the row
        with id `after`. `table` and `columns` are this module's constants, never a client's."""
        where: list[str] = []
        args: list[Any] = []
        if account_id is not None:
            args.append(account_id)
            where.append(f"account_id = ${len(args)}")
        if after is not None:
            args.append(after)
            where.append(f"seq > (SELECT seq FROM {table} WHERE id = ${len(args)})")
        sql = f"SELECT {columns} FROM {table}" + (" WHERE " + " AND ".join(where) if where else "")
        sql += " ORDER BY seq"
        if limit is not None:
            args.append(limit)
            sql += f" LIMIT ${len(args)}"
        return await self._fetch(sql, *args)

    # ------------------------------------------------------------------ keys (management)

    async def create_key(
        self,
        account_id: str,
        name: str,
        key_hash: bytes,
        prefix: str,
        expires_at_ms: int | None,
        *,
        credit_limit: Decimal | None = None,
        limit_reset: str | None = None,
    ) -> ApiKey:
        key = new_key(account_id, name, prefix, expires_at_ms, credit_limit, limit_reset)
        await self._execute(
            "INSERT INTO api_keys (id, account_id, name, key_hash, prefix, created_at_ms, expires_at_ms,"
            " credit_limit, limit_reset) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            key.id,
            account_id,
            name,
            key_hash,
            prefix,
            key.created_at_ms,
            expires_at_ms,
            credit_limit,
            limit_reset,
        )
        return key

    async def get_key(self, key_id: str) -> ApiKey | None:
        row = await self._fetchrow(f"SELECT {rows.KEY} FROM api_keys WHERE id = $1", key_id)
        return None if row is None else rows.key(row)

    async def list_keys(
        self, account_id: str, *, after: str | None = None, limit: int | None = None
    ) -> list[ApiKey]:
        return [rows.key(row) for row in await self._page("api_keys", rows.KEY, account_id, after, limit)]

    async def update_key(self, key_id: str, changes: KeyChanges) -> ApiKey | None:
        values: dict[str, Any] = {c: changes[c] for c in _KEY_CHANGES if c in changes}  # type: ignore[literal-required]

        async def update(conn: asyncpg.Connection) -> ApiKey | None:
            if values:
                assignments, args = _assignments(values), list(values.values())
                if "limit_reset" in values:
                    # A new reset starts a fresh count, in the new reset's period (gateway.budget).
                    reset = values["limit_reset"]
                    same, start = len(args) + 2, len(args) + 3
                    assignments += (
                        f", spent = CASE WHEN limit_reset IS NOT DISTINCT FROM ${same} THEN spent ELSE 0 END"
                        f", spent_period_ms = CASE WHEN limit_reset IS NOT DISTINCT FROM ${same}"
                        f" THEN spent_period_ms ELSE ${start}::bigint END"
                    )
                    args += [reset, period_start_ms(reset, now_ms())]
                status = await conn.execute(
                    f"UPDATE api_keys SET {assignments} WHERE id = $1 AND deleted_at_ms IS NULL",
                    key_id,
                    *args,
                )
                if rows.count(status) and any(term in values for term in leasing.KEY_TERMS):
                    # What each process leased of the key's limit was granted under the old terms:
                    # every one gives back its spare at its next pass (Funds.answer_recalls), and
                    # leases again under the new ones. The key's row is locked first (above): the
                    # lock order of every change to its leases.
                    await conn.execute(
                        "UPDATE leases SET recalled = true"
                        " WHERE kind = 'key' AND pot_id = $1 AND owner NOT LIKE $2",
                        key_id,
                        JOB_LEASE_PREFIX + "%",
                    )
            return await _live_key(conn, key_id)

        return await self._change_keys(update)

    async def rotate_key(self, key_id: str, key_hash: bytes, prefix: str) -> ApiKey | None:
        async def rotate(conn: asyncpg.Connection) -> ApiKey | None:
            await conn.execute(
                "UPDATE api_keys SET key_hash = $1, prefix = $2 WHERE id = $3 AND deleted_at_ms IS NULL",
                key_hash,
                prefix,
                key_id,
            )
            return await _live_key(conn, key_id)

        return await self._change_keys(rotate)

    async def delete_key(self, key_id: str) -> bool:
        async def delete(conn: asyncpg.Connection) -> bool:
            status = await conn.execute(
                "UPDATE api_keys SET deleted_at_ms = $1 WHERE id = $2 AND deleted_at_ms IS NULL",
                now_ms(),
                key_id,
            )
            return rows.count(status) == 1

        return await self._change_keys(delete)


# The columns a partial update may set (AccountChanges' and KeyChanges' fields, never a client's).
_ACCOUNT_CHANGES = ("name", "allowed_models", "rpm_limit", "tpm_limit")
_KEY_CHANGES = ("name", "credit_limit", "limit_reset", "expires_at_ms")


def _assignments(values: dict[str, Any]) -> str:
    """`col = $2, ...` for an UPDATE whose $1 is the row's id."""
    return ", ".join(f"{column} = ${i}" for i, column in enumerate(values, start=2))


async def _live_key(conn: asyncpg.Connection, key_id: str) -> ApiKey | None:
    row = await conn.fetchrow(
        f"SELECT {rows.KEY} FROM api_keys WHERE id = $1 AND deleted_at_ms IS NULL", key_id
    )
    return None if row is None else rows.key(row)


@contextlib.contextmanager
def _unique_name(name: str) -> Any:
    # The only constraint an account write can break is the unique name (ids are 96 random bits).
    try:
        yield
    except asyncpg.UniqueViolationError as exc:
        raise NameTaken(f"an account named {name!r} exists already") from exc


def _decoded_progress(found: Iterable[bytes]) -> list[Settlement]:
    """The dead processes' streams' progress as settlements. A row that is not one (written by
    hand, or by a build that wrote another form) is logged and left out: it must not keep every
    later reclaim, and the leases it returns, failing."""
    settlements = []
    for data in found:
        try:
            settlements.append(rows.decode_progress(data))
        except (ValueError, KeyError, TypeError, ArithmeticError) as exc:
            log.error("a stream's progress that is not a settlement was dropped (%s): %r", exc, data[:200])
    return settlements

"""The SQLite schema: numbered migrations (PRAGMA user_version), applied once at start-up."""

from __future__ import annotations

import sqlite3

from ..records import SchemaTooNew

# A cost's decimal text (str(Decimal): "0.00123", "1.5E-7", "1.2E+2") as an exact integer of
# picodollars, in SQL, for the request log's statistics (console.py): the mantissa's digits times the
# power of ten that makes them picodollars. -1 when that is not an integer below 10^18 (more than 12
# decimal places, or a million dollars and more) or the text is not such a decimal: those few costs
# are summed from their text. Never changed once shipped (it is in a migration).
_M = "substr(cost, 1, instr(cost, 'E') - 1)"  # the mantissa of a text with an exponent
_SCALE = (  # the power of ten that turns the mantissa's digits into picodollars
    f"(12 + CAST(substr(cost, instr(cost, 'E') + 1) AS INTEGER)"
    f" - CASE WHEN instr({_M}, '.') THEN length({_M}) - instr({_M}, '.') ELSE 0 END)"
)
_COST_PICO = f"""
    CASE
    WHEN cost IS NULL THEN NULL
    WHEN instr(cost, 'E') THEN CASE
        WHEN {_M} GLOB '*[^0-9.]*' OR {_M} NOT GLOB '[0-9]*' OR {_M} GLOB '*.*.*'
            OR {_SCALE} NOT BETWEEN 0 AND 18 OR length(replace({_M}, '.', '')) + {_SCALE} > 18
        THEN -1
        ELSE CAST(replace({_M}, '.', '') AS INTEGER)
            * CAST(substr('1000000000000000000', 1, {_SCALE} + 1) AS INTEGER)
        END
    WHEN cost GLOB '*[^0-9.]*' OR cost NOT GLOB '[0-9]*' OR cost GLOB '*.*.*' THEN -1
    WHEN instr(cost, '.') = 0 THEN
        CASE WHEN length(cost) <= 6 THEN CAST(cost AS INTEGER) * 1000000000000 ELSE -1 END
    WHEN instr(cost, '.') > 7 OR length(cost) - instr(cost, '.') > 12 THEN -1
    ELSE CAST(substr(cost, 1, instr(cost, '.') - 1) AS INTEGER) * 1000000000000
        + CAST(substr(substr(cost, instr(cost, '.') + 1) || '000000000000', 1, 12) AS INTEGER)
    END"""

# Each entry migrates the schema from version i to i + 1 (PRAGMA user_version). Append, never edit.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE accounts (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL UNIQUE,
        balance TEXT NOT NULL,
        allowed_models TEXT,
        created_at_ms INTEGER NOT NULL
    );
    CREATE TABLE api_keys (
        id TEXT PRIMARY KEY,
        account_id TEXT NOT NULL REFERENCES accounts(id),
        name TEXT NOT NULL,
        key_hash BLOB NOT NULL UNIQUE,
        prefix TEXT NOT NULL,
        created_at_ms INTEGER NOT NULL,
        expires_at_ms INTEGER,
        deleted_at_ms INTEGER
    );
    CREATE TABLE usage_records (
        id TEXT PRIMARY KEY,
        request_id TEXT NOT NULL,
        key_id TEXT NOT NULL,
        account_id TEXT NOT NULL,
        model TEXT NOT NULL,
        status TEXT NOT NULL,
        prompt_tokens INTEGER NOT NULL,
        completion_tokens INTEGER NOT NULL,
        cost TEXT NOT NULL,
        started_at_ms INTEGER NOT NULL,
        ended_at_ms INTEGER NOT NULL
    );
    CREATE INDEX usage_records_account ON usage_records(account_id, ended_at_ms);
    """,
    # Image bytes live in the database, not in files, so any instance sharing it can serve them.
    """
    CREATE TABLE images (
        token TEXT PRIMARY KEY,
        key_id TEXT NOT NULL,
        content_type TEXT NOT NULL,
        expires_at_ms INTEGER NOT NULL,
        data BLOB NOT NULL
    );
    CREATE INDEX images_expiry ON images(expires_at_ms);
    """,
    """
    CREATE TABLE response_states (
        id TEXT PRIMARY KEY,
        account_id TEXT NOT NULL,
        model TEXT NOT NULL,
        channel_url TEXT NOT NULL,
        upstream_id TEXT NOT NULL,
        expires_at_ms INTEGER NOT NULL
    );
    CREATE INDEX response_states_expiry ON response_states(expires_at_ms);
    """,
    # Accounts, keys and money: a key's own credit limit (decimal text) and its reset period, an
    # account's rate limits, and the ledger of top-ups with the balance each one left.
    """
    ALTER TABLE api_keys ADD COLUMN credit_limit TEXT;
    ALTER TABLE api_keys ADD COLUMN limit_reset TEXT;
    ALTER TABLE accounts ADD COLUMN rpm_limit INTEGER;
    ALTER TABLE accounts ADD COLUMN tpm_limit INTEGER;
    CREATE INDEX api_keys_account ON api_keys(account_id);
    CREATE TABLE top_ups (
        id TEXT PRIMARY KEY,
        account_id TEXT NOT NULL REFERENCES accounts(id),
        amount TEXT NOT NULL,
        note TEXT,
        created_at_ms INTEGER NOT NULL,
        balance_after TEXT NOT NULL
    );
    CREATE INDEX top_ups_account ON top_ups(account_id);
    """,
    # What each key spent in its current credit-limit period (gateway.budget).
    """
    ALTER TABLE api_keys ADD COLUMN spent TEXT NOT NULL DEFAULT '0';
    ALTER TABLE api_keys ADD COLUMN spent_period_ms INTEGER NOT NULL DEFAULT 0;
    """,
    # Money each live process has set aside for its holds (gateway.funds): one row per process and
    # pot, the pot being an account's balance or a key's credit limit. Owner: the process's journal.
    """
    CREATE TABLE leases (
        kind TEXT NOT NULL,
        pot_id TEXT NOT NULL,
        owner TEXT NOT NULL,
        amount TEXT NOT NULL,
        PRIMARY KEY (kind, pot_id, owner)
    );
    CREATE INDEX leases_owner ON leases(owner);
    """,
    # Every model request, failures included (RequestLog); `seq` orders them for paging.
    """
    CREATE TABLE request_logs (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT NOT NULL UNIQUE,
        key_id TEXT,
        account_id TEXT,
        method TEXT NOT NULL,
        path TEXT NOT NULL,
        model TEXT,
        status INTEGER NOT NULL,
        error_code TEXT,
        started_at_ms INTEGER NOT NULL,
        duration_ms INTEGER NOT NULL,
        cost TEXT,
        usage_id TEXT,
        request_body BLOB,
        request_bytes INTEGER NOT NULL,
        response_body BLOB,
        response_bytes INTEGER NOT NULL
    );
    CREATE INDEX request_logs_account ON request_logs(account_id, seq);
    CREATE INDEX request_logs_key ON request_logs(key_id, seq);
    CREATE INDEX request_logs_started ON request_logs(started_at_ms);
    """,
    # A top-up sent again with the same Idempotency-Key adds nothing (docs/admin.md).
    """
    ALTER TABLE top_ups ADD COLUMN idempotency_key TEXT;
    CREATE UNIQUE INDEX top_ups_idempotency ON top_ups(account_id, idempotency_key)
        WHERE idempotency_key IS NOT NULL;
    """,
    # Idempotency-Key on the model endpoints that honour it (spec 8): per API key, the request
    # that holds the key (`running`, until its lease ends) or the answer kept for it (`done`).
    """
    CREATE TABLE idempotency (
        key_id TEXT NOT NULL,
        idempotency_key TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        state TEXT NOT NULL,
        lease_until_ms INTEGER NOT NULL,
        expires_at_ms INTEGER NOT NULL,
        status INTEGER,
        headers TEXT,
        body BLOB,
        PRIMARY KEY (key_id, idempotency_key)
    );
    CREATE INDEX idempotency_expiry ON idempotency(expires_at_ms);
    """,
    # The channels a request was tried on (gateway.routing), as a JSON array.
    """
    ALTER TABLE request_logs ADD COLUMN attempts TEXT;
    """,
    # Asynchronous video jobs (VideoJob) and, once completed, their files until they expire. The
    # poll lease keeps two processes from polling one job at once.
    """
    CREATE TABLE video_jobs (
        id TEXT PRIMARY KEY,
        key_id TEXT NOT NULL,
        account_id TEXT NOT NULL,
        request_id TEXT NOT NULL,
        model TEXT NOT NULL,
        channel TEXT NOT NULL,
        upstream_id TEXT NOT NULL,
        status TEXT NOT NULL,
        progress INTEGER NOT NULL,
        prompt TEXT NOT NULL,
        seconds TEXT NOT NULL,
        size TEXT,
        hold TEXT NOT NULL,
        created_at_ms INTEGER NOT NULL,
        completed_at_ms INTEGER,
        expires_at_ms INTEGER,
        error TEXT,
        cost TEXT,
        next_poll_at_ms INTEGER NOT NULL,
        lease_until_ms INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX video_jobs_key ON video_jobs(key_id, created_at_ms);
    CREATE INDEX video_jobs_due ON video_jobs(next_poll_at_ms) WHERE status IN ('queued', 'in_progress');
    CREATE TABLE video_files (
        job_id TEXT PRIMARY KEY,
        content_type TEXT NOT NULL,
        expires_at_ms INTEGER NOT NULL,
        data BLOB NOT NULL
    );
    """,
    # Video jobs become jobs of any kind (Job): videos, and background responses (deep research),
    # which keep their latest Response object. The poll lease and the hold work alike for both.
    """
    CREATE TABLE jobs (
        id TEXT PRIMARY KEY,
        kind TEXT NOT NULL,
        key_id TEXT NOT NULL,
        account_id TEXT NOT NULL,
        request_id TEXT NOT NULL,
        model TEXT NOT NULL,
        channel TEXT NOT NULL,
        upstream_id TEXT NOT NULL,
        status TEXT NOT NULL,
        progress INTEGER NOT NULL,
        hold TEXT NOT NULL,
        created_at_ms INTEGER NOT NULL,
        completed_at_ms INTEGER,
        expires_at_ms INTEGER,
        error TEXT,
        cost TEXT,
        prompt TEXT,
        seconds TEXT,
        size TEXT,
        body BLOB,
        previous_id TEXT,
        prompt_tokens INTEGER NOT NULL DEFAULT 0,
        next_poll_at_ms INTEGER NOT NULL,
        lease_until_ms INTEGER NOT NULL DEFAULT 0
    );
    INSERT INTO jobs (id, kind, key_id, account_id, request_id, model, channel, upstream_id, status,
        progress, hold, created_at_ms, completed_at_ms, expires_at_ms, error, cost, prompt, seconds,
        size, next_poll_at_ms, lease_until_ms)
    SELECT id, 'video', key_id, account_id, request_id, model, channel, upstream_id, status,
        progress, hold, created_at_ms, completed_at_ms, expires_at_ms, error, cost, prompt, seconds,
        size, next_poll_at_ms, lease_until_ms FROM video_jobs;
    DROP TABLE video_jobs;
    CREATE INDEX jobs_key ON jobs(key_id, kind, created_at_ms);
    CREATE INDEX jobs_due ON jobs(next_poll_at_ms) WHERE status IN ('queued', 'in_progress');
    """,
    # The console (gateway.console): its users (an invitation's token kept hashed), their sessions
    # (by the sha256 of the cookie's token), playground conversations and their messages (money as
    # decimal text). The request log gets what the console's filters and charts read: an account's
    # entries by start time, and the statistics' covering indexes (console.py, log_stats): per
    # account (or all) and model, by start time, with the status and the cost as an exact integer
    # of picodollars, computed from the decimal text (cost_pico: -1 when the text has more than 12
    # decimal places or is too large, then read from the text).
    """
    CREATE TABLE console_users (
        id TEXT PRIMARY KEY,
        email TEXT NOT NULL UNIQUE,
        role TEXT NOT NULL,
        account_id TEXT REFERENCES accounts(id),
        password_hash TEXT,
        invite_hash BLOB UNIQUE,
        invite_expires_at_ms INTEGER,
        created_at_ms INTEGER NOT NULL
    );
    CREATE INDEX console_users_account ON console_users(account_id);
    CREATE TABLE console_sessions (
        id BLOB PRIMARY KEY,
        user_id TEXT REFERENCES console_users(id) ON DELETE CASCADE,
        role TEXT NOT NULL,
        account_id TEXT,
        csrf TEXT NOT NULL,
        created_at_ms INTEGER NOT NULL,
        seen_at_ms INTEGER NOT NULL,
        expires_at_ms INTEGER NOT NULL
    );
    CREATE INDEX console_sessions_user ON console_sessions(user_id);
    CREATE INDEX console_sessions_expiry ON console_sessions(expires_at_ms);
    CREATE TABLE conversations (
        id TEXT PRIMARY KEY,
        account_id TEXT NOT NULL,
        user_id TEXT,
        title TEXT NOT NULL,
        created_at_ms INTEGER NOT NULL,
        updated_at_ms INTEGER NOT NULL
    );
    CREATE INDEX conversations_account ON conversations(account_id, updated_at_ms);
    CREATE TABLE chat_messages (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT NOT NULL UNIQUE,
        conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        role TEXT NOT NULL,
        content TEXT NOT NULL,
        model TEXT,
        request_id TEXT,
        prompt_tokens INTEGER,
        completion_tokens INTEGER,
        cost TEXT,
        created_at_ms INTEGER NOT NULL
    );
    CREATE INDEX chat_messages_conversation ON chat_messages(conversation_id, seq);
    ALTER TABLE request_logs ADD COLUMN cost_pico INTEGER GENERATED ALWAYS AS (
    """
    + _COST_PICO
    + """
    ) VIRTUAL;
    CREATE INDEX request_logs_account_started ON request_logs(account_id, started_at_ms);
    CREATE INDEX request_logs_account_model
        ON request_logs(account_id, model, started_at_ms, status, cost_pico);
    CREATE INDEX request_logs_model ON request_logs(model, started_at_ms, status, cost_pico);
    """,
    # A lease another process has asked back (gateway.funds: a recall), until its owner answers.
    """
    ALTER TABLE leases ADD COLUMN recalled INTEGER NOT NULL DEFAULT 0;
    """,
    # Responses the gateway keeps itself (a chat model's translated answers): a turn's items, the
    # turn it continued, and the Response object; kept as long as their conversation.
    """
    CREATE TABLE kept_conversations (
        id TEXT PRIMARY KEY,
        expires_at_ms INTEGER NOT NULL
    );
    CREATE INDEX kept_conversations_expiry ON kept_conversations(expires_at_ms);
    CREATE TABLE kept_responses (
        id TEXT PRIMARY KEY,
        account_id TEXT NOT NULL,
        model TEXT NOT NULL,
        previous_id TEXT,
        conversation_id TEXT NOT NULL,
        items BLOB NOT NULL,
        body BLOB NOT NULL
    );
    CREATE INDEX kept_responses_conversation ON kept_responses(conversation_id);
    """,
    # A response an upstream keeps, found by the upstream's id (Store.gateway_response_id).
    """
    CREATE INDEX response_states_upstream ON response_states(upstream_id);
    """,
    # The process running the request that holds an Idempotency-Key (its journal's owner): its
    # claim ends with the process, when its journal is replayed, not when its lease runs out.
    """
    ALTER TABLE idempotency ADD COLUMN owner TEXT;
    """,
    # A response an upstream keeps: the most tokens a turn continuing it makes the upstream read.
    """
    ALTER TABLE response_states ADD COLUMN context_tokens INTEGER NOT NULL DEFAULT 0;
    """,
    # The prices a job was held at, which it is charged at (Job.prices).
    """
    ALTER TABLE jobs ADD COLUMN prices TEXT;
    """,
    # The output items of responses upstreams keep, by the account they were made for: an
    # item_reference names one by the upstream's id (Store.known_items).
    """
    CREATE TABLE response_items (
        account_id TEXT NOT NULL,
        item_id TEXT NOT NULL,
        expires_at_ms INTEGER NOT NULL,
        PRIMARY KEY (account_id, item_id)
    );
    CREATE INDEX response_items_expiry ON response_items(expires_at_ms);
    """,
)


def refuse_newer(version: int) -> None:
    """SchemaTooNew when a store's schema `version` is one a newer gateway migrated to."""
    if version > len(MIGRATIONS):
        raise SchemaTooNew(f"version {version}", f"version {len(MIGRATIONS)}")


def migrate(conn: sqlite3.Connection) -> None:
    """Bring the schema up to date, in one transaction (concurrent starts serialise on it)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        refuse_newer(version)
        for i in range(version, len(MIGRATIONS)):
            for statement in MIGRATIONS[i].split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version={i + 1}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise

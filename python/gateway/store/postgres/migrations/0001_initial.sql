-- The gateway's schema on PostgreSQL (gateway.store.postgres). Money is `numeric` without a scale:
-- exact decimals of any length, as SQLite's decimal text (a cost rounded to four significant figures
-- can have many decimal places; numeric(38, 12) would round it). Times are Unix milliseconds
-- (bigint), except the liveness of lease owners, which is the database's own clock, so that the
-- instances' clocks never decide who is dead. `seq` columns give the order rows were made in, for
-- paging (SQLite's rowid).

CREATE TABLE accounts (
    seq bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    id text PRIMARY KEY,
    name text NOT NULL UNIQUE,
    balance numeric NOT NULL,
    allowed_models text[],  -- NULL: every model; empty: none
    rpm_limit integer,
    tpm_limit integer,
    created_at_ms bigint NOT NULL
);

CREATE TABLE api_keys (
    seq bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    id text PRIMARY KEY,
    account_id text NOT NULL REFERENCES accounts(id),
    name text NOT NULL,
    key_hash bytea NOT NULL UNIQUE,
    prefix text NOT NULL,
    created_at_ms bigint NOT NULL,
    expires_at_ms bigint,
    credit_limit numeric,
    limit_reset text,
    deleted_at_ms bigint,
    -- What the key spent in the credit-limit period that starts at spent_period_ms (gateway.budget).
    spent numeric NOT NULL DEFAULT 0,
    spent_period_ms bigint NOT NULL DEFAULT 0
);
CREATE INDEX api_keys_account ON api_keys(account_id, seq);

-- Key and account changes: every change bumps the generation and notifies gateway_keys in its
-- transaction, so every process's key cache forgets what it holds (see keys.py).
CREATE TABLE key_generation (
    id integer PRIMARY KEY CHECK (id = 1),
    generation bigint NOT NULL
);
INSERT INTO key_generation (id, generation) VALUES (1, 0);

CREATE TABLE top_ups (
    seq bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    id text PRIMARY KEY,
    account_id text NOT NULL REFERENCES accounts(id),
    amount numeric NOT NULL,
    note text,
    created_at_ms bigint NOT NULL,
    balance_after numeric NOT NULL,
    idempotency_key text
);
CREATE INDEX top_ups_account ON top_ups(account_id, seq);
CREATE UNIQUE INDEX top_ups_idempotency ON top_ups(account_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

CREATE TABLE usage_records (
    id text PRIMARY KEY,
    request_id text NOT NULL,
    key_id text NOT NULL,
    account_id text NOT NULL,
    model text NOT NULL,
    status text NOT NULL,
    prompt_tokens bigint NOT NULL,
    completion_tokens bigint NOT NULL,
    cost numeric NOT NULL,
    started_at_ms bigint NOT NULL,
    ended_at_ms bigint NOT NULL
);
CREATE INDEX usage_records_account ON usage_records(account_id, ended_at_ms);

CREATE TABLE request_logs (
    seq bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    id text NOT NULL PRIMARY KEY,
    key_id text,
    account_id text,
    method text NOT NULL,
    path text NOT NULL,
    model text,
    status integer NOT NULL,
    error_code text,
    started_at_ms bigint NOT NULL,
    duration_ms bigint NOT NULL,
    cost numeric,
    usage_id text,
    attempts text,
    request_body bytea,
    request_bytes bigint NOT NULL,
    response_body bytea,
    response_bytes bigint NOT NULL
);
CREATE INDEX request_logs_account ON request_logs(account_id, seq);
CREATE INDEX request_logs_key ON request_logs(key_id, seq);
CREATE INDEX request_logs_started ON request_logs(started_at_ms);

-- Lease owners: one row per live worker process of any instance (see store.py, "Liveness").
CREATE TABLE owners (
    id text PRIMARY KEY,
    host text NOT NULL,
    pid integer NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now()
);

-- Money each live process (or job: owner 'job:<id>') has set aside for its holds (gateway.funds):
-- one row per owner and pot, the pot being an account's balance or a key's credit limit.
CREATE TABLE leases (
    kind text NOT NULL,
    pot_id text NOT NULL,
    owner text NOT NULL,
    amount numeric NOT NULL,
    PRIMARY KEY (kind, pot_id, owner)
);
CREATE INDEX leases_owner ON leases(owner);

-- A running stream's settlement so far (what it delivered), applied only if its owner dies before
-- the stream's own settlement, which deletes the row in its transaction.
CREATE TABLE stream_progress (
    owner text NOT NULL,
    usage_id text NOT NULL,
    settlement bytea NOT NULL,  -- JSON: the usage record and the log entry without bodies
    PRIMARY KEY (owner, usage_id)
);

CREATE TABLE images (
    token text PRIMARY KEY,
    key_id text NOT NULL,
    content_type text NOT NULL,
    expires_at_ms bigint NOT NULL,
    data bytea NOT NULL
);
CREATE INDEX images_expiry ON images(expires_at_ms);

CREATE TABLE response_states (
    id text PRIMARY KEY,
    account_id text NOT NULL,
    model text NOT NULL,
    channel_url text NOT NULL,
    upstream_id text NOT NULL,
    expires_at_ms bigint NOT NULL
);
CREATE INDEX response_states_expiry ON response_states(expires_at_ms);

CREATE TABLE idempotency (
    key_id text NOT NULL,
    idempotency_key text NOT NULL,
    fingerprint text NOT NULL,
    state text NOT NULL,  -- running | done
    lease_until_ms bigint NOT NULL,
    expires_at_ms bigint NOT NULL,
    status integer,
    headers bytea,  -- JSON [[name, value], ...]
    body bytea,
    PRIMARY KEY (key_id, idempotency_key)
);
CREATE INDEX idempotency_expiry ON idempotency(expires_at_ms);

CREATE TABLE jobs (
    id text PRIMARY KEY,
    kind text NOT NULL,
    key_id text NOT NULL,
    account_id text NOT NULL,
    request_id text NOT NULL,
    model text NOT NULL,
    channel text NOT NULL,
    upstream_id text NOT NULL,
    status text NOT NULL,
    progress integer NOT NULL,
    hold numeric NOT NULL,
    created_at_ms bigint NOT NULL,
    completed_at_ms bigint,
    expires_at_ms bigint,
    error text,
    cost numeric,
    prompt text,
    seconds text,
    size text,
    body bytea,
    previous_id text,
    prompt_tokens bigint NOT NULL DEFAULT 0,
    next_poll_at_ms bigint NOT NULL,
    lease_until_ms bigint NOT NULL DEFAULT 0
);
CREATE INDEX jobs_key ON jobs(key_id, kind, created_at_ms);
CREATE INDEX jobs_due ON jobs(next_poll_at_ms) WHERE status IN ('queued', 'in_progress');

CREATE TABLE video_files (
    job_id text PRIMARY KEY,
    content_type text NOT NULL,
    expires_at_ms bigint NOT NULL,
    data bytea NOT NULL
);
CREATE INDEX video_files_expiry ON video_files(expires_at_ms);

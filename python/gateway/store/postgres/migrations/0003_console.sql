-- The console (gateway.console): its users, their sessions, playground conversations and their
-- messages; and what the console's request log filters and charts read.

-- A member of one account (account_id) or an operator (NULL). The invitation's token and the
-- password are kept hashed; an open invitation has invite_hash (single use: a password clears it).
CREATE TABLE console_users (
    seq bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    id text PRIMARY KEY,
    email text NOT NULL UNIQUE,  -- lower-cased
    role text NOT NULL,
    account_id text REFERENCES accounts(id),
    password_hash text,
    invite_hash bytea UNIQUE,
    invite_expires_at_ms bigint,
    created_at_ms bigint NOT NULL
);
CREATE INDEX console_users_account ON console_users(account_id, seq);

-- A signed-in browser, by the sha256 of its cookie's token; an operator signed in with the admin
-- token has no user.
CREATE TABLE console_sessions (
    id bytea PRIMARY KEY,
    user_id text REFERENCES console_users(id) ON DELETE CASCADE,
    role text NOT NULL,
    account_id text,
    csrf text NOT NULL,
    created_at_ms bigint NOT NULL,
    seen_at_ms bigint NOT NULL,
    expires_at_ms bigint NOT NULL
);
CREATE INDEX console_sessions_user ON console_sessions(user_id);
CREATE INDEX console_sessions_expiry ON console_sessions(expires_at_ms);

CREATE TABLE conversations (
    seq bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    id text PRIMARY KEY,
    account_id text NOT NULL,
    user_id text,  -- who started it (the conversation stays with the account when they go)
    title text NOT NULL,
    created_at_ms bigint NOT NULL,
    updated_at_ms bigint NOT NULL
);
CREATE INDEX conversations_account ON conversations(account_id, updated_at_ms);

CREATE TABLE chat_messages (
    seq bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    id text PRIMARY KEY,
    conversation_id text NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role text NOT NULL,
    content text NOT NULL,
    model text,
    request_id text,
    prompt_tokens bigint,
    completion_tokens bigint,
    cost numeric,
    created_at_ms bigint NOT NULL
);
CREATE INDEX chat_messages_conversation ON chat_messages(conversation_id, seq);

-- A period's statistics (log_stats) read these indexes alone (index-only scans): an account's
-- entries, or every entry, by start time, with what the statistics add up. The first also serves
-- the lists filtered by time; the second replaces the index on the start time alone.
CREATE INDEX request_logs_account_started ON request_logs(account_id, started_at_ms)
    INCLUDE (status, model, cost);
DROP INDEX request_logs_started;
CREATE INDEX request_logs_started ON request_logs(started_at_ms) INCLUDE (status, model, cost);

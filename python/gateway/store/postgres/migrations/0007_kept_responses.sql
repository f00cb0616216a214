-- Responses the gateway keeps itself (a chat model's translated answers): a turn's items, the turn it
-- continued, and the Response object.
CREATE TABLE kept_responses (
    id text PRIMARY KEY,
    account_id text NOT NULL,
    model text NOT NULL,
    previous_id text,
    items bytea NOT NULL,
    body bytea NOT NULL,
    expires_at_ms bigint NOT NULL
);
CREATE INDEX kept_responses_expiry ON kept_responses(expires_at_ms);

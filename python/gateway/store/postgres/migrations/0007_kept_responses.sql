-- Responses the gateway keeps itself (a chat model's translated answers): a turn's items, the turn it
-- continued, and the Response object; kept as long as their conversation.
CREATE TABLE kept_conversations (
    id text PRIMARY KEY,
    expires_at_ms bigint NOT NULL
);
CREATE INDEX kept_conversations_expiry ON kept_conversations(expires_at_ms);
CREATE TABLE kept_responses (
    id text PRIMARY KEY,
    account_id text NOT NULL,
    model text NOT NULL,
    previous_id text,
    conversation_id text NOT NULL,
    items bytea NOT NULL,
    body bytea NOT NULL
);
CREATE INDEX kept_responses_conversation ON kept_responses(conversation_id);

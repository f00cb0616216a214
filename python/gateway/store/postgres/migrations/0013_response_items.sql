-- The output items of responses upstreams keep, by the account they were made for: an
-- item_reference names one by the upstream's id (Store.known_items).
CREATE TABLE response_items (
    account_id text NOT NULL,
    item_id text NOT NULL,
    expires_at_ms bigint NOT NULL,
    PRIMARY KEY (account_id, item_id)
);
CREATE INDEX response_items_expiry ON response_items (expires_at_ms);

-- The process running the request that holds an Idempotency-Key (its owners row): its claim ends
-- with the process, when its owner is reclaimed, not when its lease runs out.
ALTER TABLE idempotency ADD COLUMN owner text;

-- A response an upstream keeps: the most tokens of conversation a turn continuing it makes the
-- upstream read again (ResponseState.context_tokens), recorded before its answer goes out, so the
-- next turn's hold has them even before the response's usage record is written.
ALTER TABLE response_states ADD COLUMN context_tokens bigint NOT NULL DEFAULT 0;

-- A batch of at most one settlement (a request at a time, or a stream's progress: what the writer
-- sends while few requests run) settled by a few single-row statements instead of gateway_settle's
-- set-based ones, whose plans are built for any number of rows and cost as much to start for one:
-- a call with one settlement took the database 690-890 us of CPU that way and 350-420 us this way,
-- one with a stream's progress alone 380-390 us that way and 170-210 us this way (benches/README.md,
-- 2026-11-30). At low concurrency, where every batch is one settlement or one stream's progress,
-- that is most of what a request costs the database. The rules are gateway_settle's
-- (migrations/0002), for one usage record:
--   - the streams' progress kept for this owner (the latest replaces what was kept);
--   - request log entries inserted once by id, in order;
--   - the usage record inserted once by id; only a new one with a cost is charged;
--   - the account's balance charged; the key's spend counted in its credit-limit period when the
--     key has a limit (the period of the charge's end, or the key's own if that is later; a charge
--     of an earlier period counts nothing);
--   - this owner's leases on the account and on a limited key lowered by the cost, deleted when
--     used up;
--   - the ended streams' progress deleted, last;
-- with the same locks in the same order (the account's row, then the key's, then the leases).
-- A batch of several usage records goes to the set-based path, gateway_settle_json as
-- migrations/0004 made it, renamed here gateway_settle_json_many. Equality of the two paths:
-- tests/gateway/test_store_postgres.py.
ALTER FUNCTION gateway_settle_json(text, jsonb) RENAME TO gateway_settle_json_many;

CREATE FUNCTION gateway_settle_json(p_owner text, p_batch jsonb) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    u jsonb;
    v_account text;
    v_key text;
    v_cost numeric;
    v_ended bigint;
    v_reset text;
    v_spent numeric;
    v_current bigint;
    v_period bigint;
    v_latest bigint;
    v_limited boolean := false;
    fresh integer := 0;
BEGIN
    IF coalesce(jsonb_array_length(p_batch -> 'u'), 0) > 1 THEN
        RETURN gateway_settle_json_many(p_owner, p_batch);
    END IF;
    u := p_batch -> 'u' -> 0;  -- NULL when the batch settles nothing

    IF jsonb_array_length(p_batch -> 'pi') > 0 THEN
        INSERT INTO stream_progress (owner, usage_id, settlement)
        SELECT p_owner, p.usage_id, decode(p.data, 'base64')
        FROM ROWS FROM (jsonb_array_elements_text(p_batch -> 'pi'), jsonb_array_elements_text(p_batch -> 'pd'))
            AS p(usage_id, data)
        ON CONFLICT (owner, usage_id) DO UPDATE SET settlement = excluded.settlement;
    END IF;

    INSERT INTO request_logs (id, key_id, account_id, method, path, model, status, error_code,
        started_at_ms, duration_ms, cost, usage_id, attempts, request_body, request_bytes,
        response_body, response_bytes)
    SELECT r ->> 0, r ->> 1, r ->> 2, r ->> 3, r ->> 4, r ->> 5, (r ->> 6)::integer, r ->> 7,
        (r ->> 8)::bigint, (r ->> 9)::bigint, (r ->> 10)::numeric, r ->> 11, r ->> 12,
        decode(r ->> 13, 'base64'), (r ->> 14)::bigint, decode(r ->> 15, 'base64'), (r ->> 16)::bigint
    FROM jsonb_array_elements(p_batch -> 'l') WITH ORDINALITY AS e(r, ord)
    ORDER BY e.ord
    ON CONFLICT (id) DO NOTHING;

    IF u IS NOT NULL THEN
        INSERT INTO usage_records (id, request_id, key_id, account_id, model, status,
            prompt_tokens, completion_tokens, cost, started_at_ms, ended_at_ms)
        VALUES (u ->> 0, u ->> 1, u ->> 2, u ->> 3, u ->> 4, u ->> 5, (u ->> 6)::bigint,
            (u ->> 7)::bigint, (u ->> 8)::numeric, (u ->> 9)::bigint, (u ->> 10)::bigint)
        ON CONFLICT (id) DO NOTHING
        RETURNING account_id, key_id, cost, ended_at_ms INTO v_account, v_key, v_cost, v_ended;
        IF FOUND THEN
            fresh := 1;
        END IF;
    END IF;

    IF fresh = 1 AND v_cost <> 0 THEN
        UPDATE accounts SET balance = balance - v_cost WHERE id = v_account;

        SELECT k.limit_reset, k.spent, k.spent_period_ms INTO v_reset, v_spent, v_current
        FROM api_keys AS k WHERE k.id = v_key AND k.credit_limit IS NOT NULL FOR UPDATE;
        IF FOUND THEN
            v_limited := true;
            v_period := gateway_period_start_ms(v_reset, v_ended);
            v_latest := greatest(v_current, v_period);
            UPDATE api_keys
            SET spent = CASE WHEN v_latest = v_current THEN v_spent ELSE 0 END
                    + CASE WHEN v_period = v_latest THEN v_cost ELSE 0 END,
                spent_period_ms = v_latest
            WHERE id = v_key;
        END IF;

        IF p_owner IS NOT NULL THEN
            DELETE FROM leases
            WHERE owner = p_owner AND amount <= v_cost
                AND ((kind = 'account' AND pot_id = v_account) OR (v_limited AND kind = 'key' AND pot_id = v_key));
            UPDATE leases SET amount = amount - v_cost
            WHERE owner = p_owner AND amount > v_cost
                AND ((kind = 'account' AND pot_id = v_account) OR (v_limited AND kind = 'key' AND pot_id = v_key));
        END IF;
    END IF;

    IF jsonb_array_length(p_batch -> 'e') > 0 THEN
        DELETE FROM stream_progress
        WHERE owner = p_owner AND usage_id IN (SELECT jsonb_array_elements_text(p_batch -> 'e'));
    END IF;
    RETURN fresh;
END $$;

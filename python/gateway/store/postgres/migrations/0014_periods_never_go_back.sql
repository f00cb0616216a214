-- A key's credit-limit period never goes back (gateway.budget; time review): with instances whose
-- clocks differ by a moment, or a clock stepped back, a request could end "before" the period the
-- key is already in. Its charge was then left out of the count, and the limit left for the
-- lease was the whole limit again (a key whose period is ahead of `p_now_ms` read as spending 0):
-- across each period's start a key could spend its limit once more. Now a charge of an earlier
-- period counts in the key's own period, and a key's period later than now's is its current one.
-- The three functions as migrations 0002 and 0006 made them, each changed only there; the set-based
-- settlement now follows its batch's order (as settling each in turn does, which the single-row
-- path and the embedded store do: a charge counts in the latest period among the key's and those
-- of the charges before it).

CREATE OR REPLACE FUNCTION gateway_lease(
    p_owner text, p_host text, p_pid integer, p_kind text, p_pot_id text, p_need numeric,
    p_share integer, p_now_ms bigint, OUT granted numeric, OUT registered boolean
)
LANGUAGE plpgsql AS $$
DECLARE
    v_total numeric;
    v_limit numeric;
    v_reset text;
    v_spent numeric;
    v_period bigint;
    v_free numeric;
    v_spare numeric;
BEGIN
    granted := 0;
    registered := false;
    PERFORM 1 FROM owners WHERE id = p_owner FOR KEY SHARE;
    IF NOT FOUND THEN
        INSERT INTO owners (id, host, pid) VALUES (p_owner, p_host, p_pid) ON CONFLICT (id) DO NOTHING;
        registered := true;
    END IF;
    IF p_kind = 'account' THEN
        SELECT a.balance INTO v_total FROM accounts AS a WHERE a.id = p_pot_id FOR UPDATE;
        v_total := coalesce(v_total, 0);
    ELSIF p_kind = 'key' THEN
        SELECT k.credit_limit, k.limit_reset, k.spent, k.spent_period_ms INTO v_limit, v_reset, v_spent, v_period
        FROM api_keys AS k WHERE k.id = p_pot_id FOR UPDATE;
        IF NOT FOUND THEN  -- no such key: nothing to lease
            RETURN;
        END IF;
        IF v_limit IS NULL THEN
            granted := p_need;
            RETURN;
        END IF;
        v_total := v_limit - CASE WHEN v_period >= gateway_period_start_ms(v_reset, p_now_ms) THEN v_spent ELSE 0 END;
    ELSE
        RAISE EXCEPTION 'unknown pot kind %', p_kind;
    END IF;
    v_free := v_total - (SELECT coalesce(sum(l.amount), 0) FROM leases AS l WHERE l.kind = p_kind AND l.pot_id = p_pot_id);
    IF v_free < p_need THEN
        RETURN;
    END IF;
    -- The rule of gateway/store/leasing.py (grant), which a test holds this to: alone, the whole
    -- pot; else the need plus a share of the rest, only while that share covers 16 more holds.
    IF p_share <= 1 THEN
        granted := v_free;
    ELSE
        v_spare := div((v_free - p_need) * 1000000000, p_share) * 0.000000001;
        granted := p_need + CASE WHEN v_spare >= p_need * 16 THEN v_spare ELSE 0 END;
    END IF;
    IF granted > 0 THEN
        INSERT INTO leases (kind, pot_id, owner, amount) VALUES (p_kind, p_pot_id, p_owner, granted)
        ON CONFLICT (kind, pot_id, owner) DO UPDATE SET amount = leases.amount + excluded.amount;
    END IF;
END $$;

CREATE OR REPLACE FUNCTION gateway_settle(
    p_owner text,
    p_progress_ids text[], p_progress_data bytea[],
    u_id text[], u_request_id text[], u_key_id text[], u_account_id text[], u_model text[],
    u_status text[], u_prompt_tokens bigint[], u_completion_tokens bigint[], u_cost numeric[],
    u_started_at_ms bigint[], u_ended_at_ms bigint[],
    l_id text[], l_key_id text[], l_account_id text[], l_method text[], l_path text[],
    l_model text[], l_status integer[], l_error_code text[], l_started_at_ms bigint[],
    l_duration_ms bigint[], l_cost numeric[], l_usage_id text[], l_attempts text[],
    l_request_body bytea[], l_request_bytes bigint[], l_response_body bytea[],
    l_response_bytes bigint[],
    p_ended text[]
) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    fresh integer := 0;
    c_account text[];   -- the new records that cost something: account, key, cost, end
    c_key text[];
    c_cost numeric[];
    c_ended bigint[];
    a_ids text[];       -- per account (in id order): the total charged
    a_totals numeric[];
    limited text[];     -- the charged keys that have a credit limit
BEGIN
    -- Stream progress, log entries and usage records in one statement: their rows are new (or this
    -- owner's own progress), outside the money lock order. A usage record is inserted once by id
    -- (the first of a batch's duplicates), and only what was inserted is charged.
    WITH progress AS (
        INSERT INTO stream_progress (owner, usage_id, settlement)
        SELECT p_owner, p.usage_id, p.data FROM unnest(p_progress_ids, p_progress_data) AS p(usage_id, data)
        ON CONFLICT (owner, usage_id) DO UPDATE SET settlement = excluded.settlement
    ), logs AS (
        INSERT INTO request_logs (id, key_id, account_id, method, path, model, status, error_code,
            started_at_ms, duration_ms, cost, usage_id, attempts, request_body, request_bytes,
            response_body, response_bytes)
        SELECT e.id, e.key_id, e.account_id, e.method, e.path, e.model, e.status, e.error_code,
            e.started_at_ms, e.duration_ms, e.cost, e.usage_id, e.attempts, e.request_body,
            e.request_bytes, e.response_body, e.response_bytes
        FROM unnest(l_id, l_key_id, l_account_id, l_method, l_path, l_model, l_status, l_error_code,
            l_started_at_ms, l_duration_ms, l_cost, l_usage_id, l_attempts, l_request_body,
            l_request_bytes, l_response_body, l_response_bytes) WITH ORDINALITY
            AS e(id, key_id, account_id, method, path, model, status, error_code, started_at_ms,
                duration_ms, cost, usage_id, attempts, request_body, request_bytes, response_body,
                response_bytes, ord)
        ORDER BY e.ord
        ON CONFLICT (id) DO NOTHING
    ), inserted AS (
        INSERT INTO usage_records (id, request_id, key_id, account_id, model, status,
            prompt_tokens, completion_tokens, cost, started_at_ms, ended_at_ms)
        SELECT DISTINCT ON (u.id) u.id, u.request_id, u.key_id, u.account_id, u.model, u.status,
            u.prompt_tokens, u.completion_tokens, u.cost, u.started_at_ms, u.ended_at_ms
        FROM unnest(u_id, u_request_id, u_key_id, u_account_id, u_model, u_status,
            u_prompt_tokens, u_completion_tokens, u_cost, u_started_at_ms, u_ended_at_ms)
            WITH ORDINALITY AS u(id, request_id, key_id, account_id, model, status, prompt_tokens,
                completion_tokens, cost, started_at_ms, ended_at_ms, ord)
        ORDER BY u.id, u.ord
        ON CONFLICT (id) DO NOTHING
        RETURNING usage_records.id, usage_records.account_id, usage_records.key_id, usage_records.cost,
            usage_records.ended_at_ms
    ), charged AS (  -- with each record's place in the batch: a key's count follows the batch's order
        SELECT i.account_id, i.key_id, i.cost, i.ended_at_ms, o.ord FROM inserted AS i
        JOIN (SELECT x.id, min(x.ord) AS ord FROM unnest(u_id) WITH ORDINALITY AS x(id, ord) GROUP BY x.id)
            AS o ON o.id = i.id
        WHERE i.cost <> 0
    ), per_account AS (
        SELECT c.account_id, sum(c.cost) AS total FROM charged AS c GROUP BY c.account_id
    )
    SELECT (SELECT count(*)::integer FROM inserted),
        array_agg(c.account_id ORDER BY c.ord), array_agg(c.key_id ORDER BY c.ord),
        array_agg(c.cost ORDER BY c.ord), array_agg(c.ended_at_ms ORDER BY c.ord),
        (SELECT array_agg(a.account_id ORDER BY a.account_id) FROM per_account AS a),
        (SELECT array_agg(a.total ORDER BY a.account_id) FROM per_account AS a)
    INTO fresh, c_account, c_key, c_cost, c_ended, a_ids, a_totals
    FROM charged AS c;

    IF a_ids IS NOT NULL THEN
        IF cardinality(a_ids) = 1 THEN
            UPDATE accounts SET balance = balance - a_totals[1] WHERE id = a_ids[1];
        ELSE  -- several rows: locked in id order first
            PERFORM 1 FROM accounts WHERE id = ANY(a_ids) ORDER BY id FOR UPDATE;
            UPDATE accounts AS a SET balance = a.balance - t.total
            FROM unnest(a_ids, a_totals) AS t(account_id, total) WHERE a.id = t.account_id;
        END IF;

        -- What each key with a limit spent in its period (gateway.budget.counted), as settling the
        -- batch's charges one by one in order gives: a charge counts in the period its request
        -- ended in, or in the key's own when that is later (`at`: the latest of the key's period
        -- and of the charges' up to this one); a later period starts the count again. So the key's
        -- period becomes the latest `at`, and its spend what it had (if that period stays) plus
        -- the charges counted in it.
        WITH locked AS MATERIALIZED (
            SELECT k.id, k.limit_reset, k.spent, k.spent_period_ms FROM api_keys AS k
            WHERE k.id = ANY(c_key) AND k.credit_limit IS NOT NULL ORDER BY k.id FOR UPDATE
        ), charges AS (
            SELECT l.id, l.spent, l.spent_period_ms AS current, c.cost, c.ord,
                gateway_period_start_ms(l.limit_reset, c.ended) AS period
            FROM locked AS l JOIN unnest(c_key, c_cost, c_ended) WITH ORDINALITY AS c(key_id, cost, ended, ord)
                ON c.key_id = l.id
        ), placed AS (
            SELECT ch.id, ch.spent, ch.current, ch.cost,
                greatest(ch.current, max(ch.period) OVER (PARTITION BY ch.id ORDER BY ch.ord
                    ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)) AS at
            FROM charges AS ch
        ), latest AS (
            SELECT p.id, max(p.at) AS period FROM placed AS p GROUP BY p.id
        ), counted AS (
            SELECT p.id, t.period,
                CASE WHEN t.period = min(p.current) THEN min(p.spent) ELSE 0 END
                    + coalesce(sum(p.cost) FILTER (WHERE p.at = t.period), 0) AS spent
            FROM placed AS p JOIN latest AS t ON t.id = p.id GROUP BY p.id, t.period
        ), updated AS (
            UPDATE api_keys AS k SET spent = n.spent, spent_period_ms = n.period
            FROM counted AS n WHERE k.id = n.id RETURNING k.id
        )
        SELECT array_agg(u.id) INTO limited FROM updated AS u;

        IF p_owner IS NOT NULL THEN
            -- The charges come off this owner's leases: a lease they use up is deleted, the others
            -- shrink (both parts see the amounts as they were, and touch different rows).
            WITH t AS (
                SELECT 'account' AS kind, a.pot_id, a.amount FROM unnest(a_ids, a_totals) AS a(pot_id, amount)
                UNION ALL
                SELECT 'key', c.key_id, sum(c.cost) FROM unnest(c_key, c_cost) AS c(key_id, cost)
                WHERE c.key_id = ANY(limited) GROUP BY c.key_id
            ), used_up AS (
                DELETE FROM leases AS l USING t
                WHERE l.kind = t.kind AND l.pot_id = t.pot_id AND l.owner = p_owner AND l.amount <= t.amount
            )
            UPDATE leases AS l SET amount = l.amount - t.amount FROM t
            WHERE l.kind = t.kind AND l.pot_id = t.pot_id AND l.owner = p_owner AND l.amount > t.amount;
        END IF;
    END IF;

    IF cardinality(p_ended) > 0 THEN
        DELETE FROM stream_progress WHERE owner = p_owner AND usage_id = ANY(p_ended);
    END IF;
    RETURN fresh;
END $$;

CREATE OR REPLACE FUNCTION gateway_settle_json(p_owner text, p_batch jsonb) RETURNS integer
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
                    + v_cost,
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

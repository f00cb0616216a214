-- A settlement batch in one round trip (gateway.store.postgres.rows.settle_many, writer.py): the
-- writer's whole batch (stream progress, request log entries, settlements) is one
-- `SELECT gateway_settle(...)`, its own transaction, instead of BEGIN, a statement per step and
-- COMMIT. The commit stays durable (synchronous_commit as the server has it, on by default): a
-- settlement is on disk before its request is answered.

-- gateway.budget.period_start_ms: the start (ms since the epoch, UTC) of the credit-limit period
-- containing `at_ms`; 0 for a limit that never resets. Weeks are ISO weeks (from Monday).
CREATE FUNCTION gateway_period_start_ms(reset text, at_ms bigint) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    day timestamp := date_trunc('day', to_timestamp(floor(at_ms / 1000.0)) AT TIME ZONE 'UTC');
BEGIN
    IF reset IS NULL THEN
        RETURN 0;
    ELSIF reset = 'weekly' THEN
        day := date_trunc('week', day);
    ELSIF reset = 'monthly' THEN
        day := date_trunc('month', day);
    ELSIF reset <> 'daily' THEN
        RAISE EXCEPTION 'unknown limit reset %', reset;
    END IF;
    RETURN (extract(epoch FROM day) * 1000)::bigint;
END $$;

-- One batch, in the caller's transaction (or its own when called alone). Each argument is a column:
-- the i-th element of every u_ array is one usage record, of every l_ array one log entry.
--   p_owner        the process whose stream progress this is, and whose leases the charges come
--                  off (NULL: no progress, no lease, as a reclaim or a job's end)
--   p_progress_*   the latest progress of running streams (upserted)
--   u_*            usage records: each inserted only if its id is new, and only those charged
--   l_*            request log entries (inserted in order, an id already there skipped)
--   p_ended        streams whose progress goes (settled, or ended without a settlement)
-- Returns how many usage records were new. The steps and the lock order are those of every money
-- transaction (rows.py): accounts by id, then keys by id, then lease rows.
CREATE FUNCTION gateway_settle(
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
        RETURNING usage_records.account_id, usage_records.key_id, usage_records.cost,
            usage_records.ended_at_ms
    ), charged AS (
        SELECT i.account_id, i.key_id, i.cost, i.ended_at_ms FROM inserted AS i WHERE i.cost <> 0
    ), per_account AS (
        SELECT c.account_id, sum(c.cost) AS total FROM charged AS c GROUP BY c.account_id
    )
    SELECT (SELECT count(*)::integer FROM inserted),
        array_agg(c.account_id), array_agg(c.key_id), array_agg(c.cost), array_agg(c.ended_at_ms),
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

        -- What each key with a limit spent in its period (gateway.budget): a charge counts in the
        -- period its request ended in; a later period starts the count again; a charge from a
        -- period already over no longer counts. So the key's period becomes the latest of its own
        -- and its charges', and its spend what it had (if that period stays) plus the charges of it.
        WITH locked AS MATERIALIZED (
            SELECT k.id, k.limit_reset, k.spent, k.spent_period_ms FROM api_keys AS k
            WHERE k.id = ANY(c_key) AND k.credit_limit IS NOT NULL ORDER BY k.id FOR UPDATE
        ), charges AS (
            SELECT l.id, l.spent, l.spent_period_ms AS current, c.cost,
                gateway_period_start_ms(l.limit_reset, c.ended) AS period
            FROM locked AS l JOIN unnest(c_key, c_cost, c_ended) AS c(key_id, cost, ended) ON c.key_id = l.id
        ), latest AS (
            SELECT ch.id, greatest(min(ch.current), max(ch.period)) AS period FROM charges AS ch GROUP BY ch.id
        ), counted AS (
            SELECT ch.id, t.period,
                CASE WHEN t.period = min(ch.current) THEN min(ch.spent) ELSE 0 END
                    + coalesce(sum(ch.cost) FILTER (WHERE ch.period = t.period), 0) AS spent
            FROM charges AS ch JOIN latest AS t ON t.id = ch.id GROUP BY ch.id, t.period
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

-- A lease (PostgresStore.lease) in one round trip: `p_need` and a `p_share`-th part of what is left
-- free of the pot (an account's balance, or what is left of a key's credit limit in the period of
-- `p_now_ms`) once every owner's leases are counted, added to `p_owner`'s lease; 0 when the pot has
-- not `p_need` free; `p_need` alone for a key without a limit (nothing leased: only the account
-- counts). The owner's row is held (FOR KEY SHARE) so that no reclaim deletes it meanwhile, and made
-- again (`registered`) when a reclaim took it; then the pot's row is locked, then lease rows: the
-- lock order of rows.py. Parts are whole nano-dollars, rounded down.
CREATE FUNCTION gateway_lease(
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
        v_total := v_limit - CASE WHEN v_period = gateway_period_start_ms(v_reset, p_now_ms) THEN v_spent ELSE 0 END;
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

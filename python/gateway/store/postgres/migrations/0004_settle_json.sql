-- A settlement batch as one JSON parameter (rows.settle_batch, writer.py). asyncpg encodes
-- gateway_settle's 32 array parameters element by element in the gateway's process: ~93 us of its
-- CPU for a batch of one settlement, ~22 us a settlement in a batch of 20, where one text parameter
-- of the same size costs a few (benches/README.md, 2026-11-29). The database takes the arrays back
-- out of the JSON here and settles them with gateway_settle, unchanged.
--
-- p_batch: {"pi": [progress usage ids], "pd": [progress data, base64],
--           "u": [[a usage record's 11 fields, in gateway_settle's u_ order], ...],
--           "l": [[a log entry's 17 fields, in its l_ order], ...], "e": [ended usage ids]}
-- Whole numbers are JSON numbers, money (cost) decimal text, bodies base64 text.
CREATE FUNCTION gateway_settle_json(p_owner text, p_batch jsonb) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    p_ids text[];
    p_data bytea[];
    u_id text[]; u_request_id text[]; u_key_id text[]; u_account_id text[]; u_model text[];
    u_status text[]; u_prompt_tokens bigint[]; u_completion_tokens bigint[]; u_cost numeric[];
    u_started_at_ms bigint[]; u_ended_at_ms bigint[];
    l_id text[]; l_key_id text[]; l_account_id text[]; l_method text[]; l_path text[];
    l_model text[]; l_status integer[]; l_error_code text[]; l_started_at_ms bigint[];
    l_duration_ms bigint[]; l_cost numeric[]; l_usage_id text[]; l_attempts text[];
    l_request_body bytea[]; l_request_bytes bigint[]; l_response_body bytea[];
    l_response_bytes bigint[];
    p_ended text[];
BEGIN
    SELECT coalesce(array_agg(x ORDER BY n), '{}') INTO p_ids
    FROM jsonb_array_elements_text(p_batch -> 'pi') WITH ORDINALITY AS t(x, n);
    SELECT coalesce(array_agg(decode(x, 'base64') ORDER BY n), '{}') INTO p_data
    FROM jsonb_array_elements_text(p_batch -> 'pd') WITH ORDINALITY AS t(x, n);

    SELECT coalesce(array_agg(r ->> 0 ORDER BY n), '{}'),
        coalesce(array_agg(r ->> 1 ORDER BY n), '{}'),
        coalesce(array_agg(r ->> 2 ORDER BY n), '{}'),
        coalesce(array_agg(r ->> 3 ORDER BY n), '{}'),
        coalesce(array_agg(r ->> 4 ORDER BY n), '{}'),
        coalesce(array_agg(r ->> 5 ORDER BY n), '{}'),
        coalesce(array_agg((r ->> 6)::bigint ORDER BY n), '{}'),
        coalesce(array_agg((r ->> 7)::bigint ORDER BY n), '{}'),
        coalesce(array_agg((r ->> 8)::numeric ORDER BY n), '{}'),
        coalesce(array_agg((r ->> 9)::bigint ORDER BY n), '{}'),
        coalesce(array_agg((r ->> 10)::bigint ORDER BY n), '{}')
    INTO u_id, u_request_id, u_key_id, u_account_id, u_model, u_status, u_prompt_tokens,
        u_completion_tokens, u_cost, u_started_at_ms, u_ended_at_ms
    FROM jsonb_array_elements(p_batch -> 'u') WITH ORDINALITY AS t(r, n);

    SELECT coalesce(array_agg(r ->> 0 ORDER BY n), '{}'),
        coalesce(array_agg(r ->> 1 ORDER BY n), '{}'),
        coalesce(array_agg(r ->> 2 ORDER BY n), '{}'),
        coalesce(array_agg(r ->> 3 ORDER BY n), '{}'),
        coalesce(array_agg(r ->> 4 ORDER BY n), '{}'),
        coalesce(array_agg(r ->> 5 ORDER BY n), '{}'),
        coalesce(array_agg((r ->> 6)::integer ORDER BY n), '{}'),
        coalesce(array_agg(r ->> 7 ORDER BY n), '{}'),
        coalesce(array_agg((r ->> 8)::bigint ORDER BY n), '{}'),
        coalesce(array_agg((r ->> 9)::bigint ORDER BY n), '{}'),
        coalesce(array_agg((r ->> 10)::numeric ORDER BY n), '{}'),
        coalesce(array_agg(r ->> 11 ORDER BY n), '{}'),
        coalesce(array_agg(r ->> 12 ORDER BY n), '{}'),
        coalesce(array_agg(decode(r ->> 13, 'base64') ORDER BY n), '{}'),
        coalesce(array_agg((r ->> 14)::bigint ORDER BY n), '{}'),
        coalesce(array_agg(decode(r ->> 15, 'base64') ORDER BY n), '{}'),
        coalesce(array_agg((r ->> 16)::bigint ORDER BY n), '{}')
    INTO l_id, l_key_id, l_account_id, l_method, l_path, l_model, l_status, l_error_code,
        l_started_at_ms, l_duration_ms, l_cost, l_usage_id, l_attempts, l_request_body,
        l_request_bytes, l_response_body, l_response_bytes
    FROM jsonb_array_elements(p_batch -> 'l') WITH ORDINALITY AS t(r, n);

    SELECT coalesce(array_agg(x ORDER BY n), '{}') INTO p_ended
    FROM jsonb_array_elements_text(p_batch -> 'e') WITH ORDINALITY AS t(x, n);

    RETURN gateway_settle(p_owner, p_ids, p_data,
        u_id, u_request_id, u_key_id, u_account_id, u_model, u_status, u_prompt_tokens,
        u_completion_tokens, u_cost, u_started_at_ms, u_ended_at_ms,
        l_id, l_key_id, l_account_id, l_method, l_path, l_model, l_status, l_error_code,
        l_started_at_ms, l_duration_ms, l_cost, l_usage_id, l_attempts, l_request_body,
        l_request_bytes, l_response_body, l_response_bytes,
        p_ended);
END $$;

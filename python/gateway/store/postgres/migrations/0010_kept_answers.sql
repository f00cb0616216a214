-- An Idempotency-Key's answer kept in the same statement as its request's charge (writer.py,
-- rows.SETTLE_KEEPING) or job (Store.create_job): a process killed between the two could leave a
-- charge whose key, freed with the process's claims, a retry ran, and was charged for, again.
-- p_batch -> 'a': [[key_id, idempotency_key, fingerprint, status, headers (JSON, base64),
-- body (base64), expires_at_ms], ...]. An answer finishes only the claim of the request that made
-- it (its fingerprint, still running): applied again, it changes nothing. Returns how many it kept.
CREATE FUNCTION gateway_keep_answers(p_batch jsonb) RETURNS integer
LANGUAGE sql AS $$
    WITH kept AS (
        UPDATE idempotency AS i
        SET state = 'done', status = (a ->> 3)::integer, headers = decode(a ->> 4, 'base64'),
            body = decode(a ->> 5, 'base64'), expires_at_ms = (a ->> 6)::bigint
        FROM jsonb_array_elements(coalesce(p_batch -> 'a', '[]'::jsonb)) AS t(a)
        WHERE i.key_id = a ->> 0 AND i.idempotency_key = a ->> 1 AND i.fingerprint = a ->> 2
            AND i.state = 'running'
        RETURNING 1
    )
    SELECT count(*)::integer FROM kept
$$;

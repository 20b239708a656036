-- name: job_settle_lost
-- SPEC L6', P3, O1: the outcome of an attempt whose handler returned but whose write was given
-- up with the store (its lease ran out meanwhile), written later by the engine that ran it, under
-- that attempt's claim token, inside the caller's transaction (with its closing work, C9). It is
-- written only while the row is nobody else's since:
--   - still processing under that claim (its lease may have expired: no one took it);
--   - returned to pending by the reaper and not claimed since (the reaper keeps the claim token
--     and the attempts; a claim changes the token, an operator's retry resets attempts, an
--     enqueue that replaces the holder of its unique key clears the token: another job's now);
--   - for a last attempt (%(last)s), held by the claim that came next: processing, one attempt
--     more, so claimed past max_attempts, never run, its poison verdict held back for this (L5).
-- The row then reads as if the write had come in time: that attempt's count, claim token and
-- worker. A row already in the outcome's state under that claim is an earlier write of this same
-- outcome whose answer was lost: 'again' (written; its closing work, if any, committed with it). V2: a done notifies the results channel at commit.
-- L3': a row another transaction holds locked is never waited for: nothing is written and the
-- answer is 'locked' (tried again later; the heartbeat keeps such a lease, P1').
WITH free AS MATERIALIZED (
    SELECT id FROM {job} WHERE id = %(id)s FOR NO KEY UPDATE SKIP LOCKED
), written AS (
    UPDATE {job}
    SET state = %(state)s,
        attempts = %(attempt)s,
        claim_token = %(token)s,
        locked_by = %(worker)s,
        available_at = CASE WHEN %(state)s = 'failed' THEN now() + %(delay)s::interval ELSE available_at END,
        last_error = coalesce(%(error)s, last_error),
        result = CASE WHEN %(state)s = 'done' THEN %(result)s::jsonb ELSE result END,
        errors = CASE WHEN %(state)s IN ('failed', 'dead') AND %(error)s::text IS NOT NULL
                      THEN jsonb_path_query_array(
                          coalesce(errors, '[]'::jsonb) || jsonb_build_array(jsonb_build_object(
                              'attempt', %(attempt)s::int, 'at', now(), 'error', %(error)s::text,
                              'traceback', %(traceback)s::text)),
                          '$[last - 19 to last]')
                      ELSE errors END,
        updated_at = now()
    WHERE id = %(id)s AND id IN (SELECT id FROM free) AND (
        (state = 'processing' AND claim_token = %(token)s)
        OR (state = 'pending' AND claim_token = %(token)s AND attempts = %(attempt)s)
        OR (%(last)s AND state = 'processing' AND attempts = %(attempt)s + 1)
    )
    RETURNING id, (SELECT pg_notify({settled_channel_literal}, '') WHERE %(notify)s::bool)::text AS notified
)
SELECT id, notified FROM written
UNION ALL
SELECT id, 'again' FROM {job}
WHERE id = %(id)s AND state = %(state)s AND claim_token = %(token)s AND NOT EXISTS (SELECT FROM written)
UNION ALL
SELECT id, 'locked' FROM {job}
WHERE id = %(id)s AND NOT EXISTS (SELECT FROM free)

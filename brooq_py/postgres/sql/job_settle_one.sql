-- name: job_settle_one
-- One guarded outcome inside the caller's transaction (done + chained enqueues).
-- V1: a done writes its result; V3: a failed or dead appends to errors (the last 20
-- kept). V2: one NOTIFY on the results channel when it ends the job, sent at the
-- caller's commit (the RETURNING subquery runs once; its column is not read).
-- L3': the row is locked FOR NO KEY UPDATE SKIP LOCKED, never waited for. One row
-- answers: 'ours' (written), 'locked' (still the claim's, another transaction holds
-- it: nothing written); none: no longer the claim's (canceled, reaped, claimed again).
WITH mine AS MATERIALIZED (
    SELECT id FROM {live}
    WHERE id = %(id)s AND state = 'processing' AND claim_token = %(token)s
    FOR NO KEY UPDATE SKIP LOCKED
), written AS (
    UPDATE {live} j
    SET state = %(state)s,
        attempts = CASE WHEN %(give_back)s THEN greatest(attempts - 1, 0) ELSE attempts END,
        available_at = CASE WHEN %(state)s IN ('failed', 'pending') THEN now() + %(delay)s::interval
                            ELSE available_at END,
        last_error = coalesce(%(error)s, last_error),
        locked_by = CASE WHEN %(state)s = 'pending' THEN NULL ELSE locked_by END,
        locked_until = CASE WHEN %(state)s = 'pending' THEN NULL ELSE locked_until END,
        result = CASE WHEN %(state)s = 'done' THEN %(result)s::jsonb ELSE result END,
        errors = CASE WHEN %(state)s IN ('failed', 'dead') AND %(error)s::text IS NOT NULL
                      THEN jsonb_path_query_array(
                          coalesce(errors, '[]'::jsonb) || jsonb_build_array(jsonb_build_object(
                              'attempt', attempts, 'at', now(), 'error', %(error)s::text,
                              'traceback', %(traceback)s::text)),
                          '$[last - 19 to last]')
                      ELSE errors END,
        waiting_for = NULL,
        updated_at = now()
    FROM mine
    WHERE j.id = mine.id
    RETURNING j.id, (SELECT pg_notify({settled_channel_literal}, '') WHERE %(notify)s::bool)
)
SELECT 'ours' FROM written
UNION ALL
SELECT 'locked' FROM {live}
WHERE id = %(id)s AND state = 'processing' AND claim_token = %(token)s AND NOT EXISTS (SELECT FROM mine)

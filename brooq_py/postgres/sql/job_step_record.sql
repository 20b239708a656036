-- name: job_step_record
-- SPEC DS1-DS4: record one step, sleep or wait at its position, only while the job is still
-- processing under this attempt's claim token. FOR SHARE holds the row until the commit (this
-- statement's, or transaction_step's), so no reaper, cancel or new claim can change its owner in
-- between: a stale or fenced attempt records nothing (ours = false). A sleep or a wait records
-- its end, now() + %(delay)s on the database clock. One row: ours, inserted (false
-- when this position was recorded already), the recorded result, now().
WITH mine AS MATERIALIZED (
    SELECT id FROM {live}
    WHERE id = %(id)s AND state = 'processing' AND claim_token = %(token)s
    FOR SHARE
), recorded AS (
    INSERT INTO {job_step} (job_id, seq, name, kind, result)
    SELECT m.id, %(seq)s, %(name)s, %(kind)s,
           CASE WHEN %(kind)s = 'step' THEN %(result)s::jsonb
                ELSE jsonb_build_object('until', now() + %(delay)s::interval) END
    FROM mine m
    ON CONFLICT (job_id, seq) DO NOTHING
    RETURNING result
)
SELECT EXISTS (SELECT FROM mine), EXISTS (SELECT FROM recorded),
       coalesce((SELECT r.result FROM recorded r),
                (SELECT s.result FROM {job_step} s WHERE s.job_id = %(id)s AND s.seq = %(seq)s)),
       now()

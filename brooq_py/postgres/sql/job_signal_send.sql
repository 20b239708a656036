-- name: job_signal_send
-- SPEC DS4: record a signal for a job that has not ended; the first of a name is kept (a later
-- one records nothing: false). The job's row is read, never locked nor written, so a signal
-- never waits on a lock its engine or an operator holds, and never conflicts with the engine's
-- writes in a caller's REPEATABLE READ transaction. The stagers wake a job waiting for it
-- (job_release_due), woken themselves at this commit by one NOTIFY on the stage channel.
WITH target AS (
    SELECT id FROM {job} WHERE id = %(id)s AND state NOT IN ('done', 'dead', 'canceled')
), sent AS (
    INSERT INTO {job_signal} (job_id, name, payload)
    SELECT t.id, %(name)s, %(payload)s::jsonb FROM target t
    ON CONFLICT (job_id, name) DO NOTHING
    RETURNING job_id
)
SELECT EXISTS (SELECT FROM sent),
       (SELECT pg_notify({stage_channel_literal}, '') WHERE EXISTS (SELECT FROM sent))

-- name: job_terminal_lock
-- SPEC T1, T2: retention's first statement, in the transaction of job_delete_terminal: one
-- batch of terminal rows older than the ttl, oldest first, locked; of the job table alone (SPEC
-- B2: a day of history goes whole once all of it is older than the ttl, never row by row).
-- SPEC D4, Q5: not a row that terminal_kept.sql keeps. This snapshot may miss a child committed
-- after it was taken and before the lock below: job_delete_terminal looks again, in a
-- snapshot taken after the lock.
-- A parent locked by an enqueue naming it is skipped (SKIP LOCKED); an enqueue that locks it
-- after this statement waits for the delete, then finds it gone (InvalidJob).
-- SPEC DS5: it also deletes up to %(batch)s signals whose job is gone: a signal reads its
-- job's row without a lock, so one can commit after this pass deleted its job. Such a
-- signal was never looked at by a stager (woke is false until one sees its job), so the
-- partial index of those (a few rows: the signals of running jobs) finds it; each is
-- probed by the job's primary key. The stagers delete them too (job_release_due).
-- Steps need no such pass: job_step_record holds its job's row (FOR SHARE) until it
-- commits, and only a processing row takes a step, so no step outlives its job.
WITH orphans AS (
    DELETE FROM {job_signal} g
    WHERE (g.job_id, g.name) IN (
        SELECT o.job_id, o.name
        FROM {job_signal} o
        WHERE NOT o.woke AND NOT EXISTS (SELECT FROM {job} w WHERE w.id = o.job_id)
        LIMIT %(batch)s
        FOR UPDATE SKIP LOCKED)
)
SELECT j.id
FROM {live} j
WHERE j.state IN ('done', 'dead', 'canceled') AND j.updated_at < now() - %(ttl)s::interval
  AND NOT {terminal_kept}
ORDER BY j.updated_at
LIMIT %(batch)s
FOR UPDATE SKIP LOCKED

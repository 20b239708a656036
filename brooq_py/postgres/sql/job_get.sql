-- name: job_get
-- The whole row in one SELECT: its result, attempt history and progress included
-- (NOTES: no separate delivery log).
SELECT id, topic, payload, state, attempts, priority, available_at, locked_by, locked_until,
       last_error, idempotency_key, created_at, updated_at,
       result, errors, progress, progress_note, meta, parents
FROM {job}
WHERE id = %(id)s

-- name: job_get
SELECT id, topic, payload, state, attempts, priority, available_at, locked_by, locked_until,
       last_error, idempotency_key, created_at, updated_at, unique_key, parents
FROM {job}
WHERE id = %(id)s

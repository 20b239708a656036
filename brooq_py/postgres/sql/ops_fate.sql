-- name: ops_fate
-- A job's fate in one query: the queue's main promise (SPEC O3).
SELECT id, topic, state, attempts, last_error, available_at, locked_by, locked_until
FROM {job}
WHERE id = %(id)s

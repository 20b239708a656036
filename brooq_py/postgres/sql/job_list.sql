-- name: job_list
-- The newest jobs first (ids are UUIDv7: the primary key read backwards), of one
-- topic and/or one state when given (the `jobs` command). An operator's read:
-- with a filter it walks the key until `limit` rows match.
SELECT id, topic, payload, state, attempts, priority, available_at, locked_by, locked_until,
       last_error, idempotency_key, created_at, updated_at, unique_key, parents
FROM {job}
WHERE (%(topic)s::text IS NULL OR topic = %(topic)s)
  AND (%(state)s::text IS NULL OR state = %(state)s)
ORDER BY id DESC
LIMIT %(limit)s

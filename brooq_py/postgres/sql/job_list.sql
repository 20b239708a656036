-- name: job_list
-- The jobs of a schema, oldest first, optionally of one topic and/or one state
-- (the testing kit's jobs() and assert_enqueued()). Bounded by %(limit)s.
SELECT id, topic, payload, state, attempts, priority, available_at, locked_by, locked_until,
       last_error, idempotency_key, created_at, updated_at
FROM {job}
WHERE (%(topic)s::text IS NULL OR topic = %(topic)s::text)
  AND (%(state)s::text IS NULL OR state::text = %(state)s::text)
ORDER BY created_at, id
LIMIT %(limit)s

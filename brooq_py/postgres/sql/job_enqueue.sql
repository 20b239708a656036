-- name: job_enqueue
-- One job; a (topic, key) already present inserts nothing and returns no row
-- (never a unique violation into the caller's transaction: SPEC E1, E2).
INSERT INTO {job} (id, topic, payload, idempotency_key, available_at, priority)
VALUES (%(id)s, %(topic)s, %(payload)s::jsonb, %(key)s, coalesce(%(available_at)s::timestamptz, now()), %(priority)s)
ON CONFLICT (topic, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id

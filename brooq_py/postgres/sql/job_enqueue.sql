-- name: job_enqueue
-- One job; a (topic, key) already present inserts nothing and returns no row
-- (never a unique violation into the caller's transaction: SPEC E1, E2).
-- available_at defaults to the statement's time, not the transaction's; a job
-- due later than that is scheduled, and the stager makes it pending (SPEC S5).
INSERT INTO {job} (id, topic, payload, idempotency_key, available_at, priority, state)
SELECT %(id)s, %(topic)s, %(payload)s::jsonb, %(key)s, a.at, %(priority)s,
       CASE WHEN a.at > statement_timestamp() THEN 'scheduled' ELSE 'pending' END
FROM (SELECT coalesce(%(available_at)s::timestamptz, statement_timestamp()) AS at) AS a
ON CONFLICT (topic, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id

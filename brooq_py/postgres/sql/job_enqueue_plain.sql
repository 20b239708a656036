-- name: job_enqueue_plain
-- One job without an idempotency key: a plain insert. Without a key it is never
-- deduplicated (SPEC E1), so no ON CONFLICT; its id is made by the caller (SPEC Z4),
-- so nothing comes back. available_at defaults to the statement's time; a job due
-- later than that is scheduled, and the stager makes it pending (SPEC S5).
INSERT INTO {job} (id, topic, payload, priority, meta, available_at, state{tenant_col})
VALUES (%(id)s, %(topic)s, %(payload)s::jsonb, %(priority)s, %(meta)s::jsonb,
        coalesce(%(available_at)s::timestamptz, statement_timestamp()),
        CASE WHEN %(available_at)s::timestamptz > statement_timestamp() THEN 'scheduled' ELSE 'pending' END{tenant_param})

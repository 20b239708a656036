-- name: job_enqueue_unique
-- SPEC U1, U2: one job with a unique key, kept (on_duplicate 'keep', or any job
-- that also carries an idempotency key). ON CONFLICT without a target takes
-- both unique indexes as arbiters: a duplicate of either inserts nothing and
-- never raises into the caller's transaction. Rows, in one answer:
-- ('created', id, NULL) when inserted; else ('key', id, state) for the row
-- holding the idempotency key, ('unique', id, state) for the active holder of
-- the unique key, as this statement's snapshot sees them; ('full', NULL, NULL)
-- when the depth cap refused it (%(cap)s, %(base)s, %(seq0)s, %(cp_m)s:
-- as in job_enqueue, and every row ends with job_enqueue's four columns). No row at
-- all: a holder committed while we waited on it, or ended meanwhile (ask again).
WITH {depth_room}
), ins AS (
    INSERT INTO {job} (id, topic, payload, idempotency_key, unique_key, meta, available_at, priority, state{tenant_col})
    SELECT %(id)s, %(topic)s, %(payload)s::jsonb, %(key)s, %(unique_key)s, %(meta)s::jsonb, a.at, %(priority)s,
           CASE WHEN a.at > statement_timestamp() THEN 'scheduled' ELSE 'pending' END{tenant_param}
    FROM a
    WHERE a.room
    ON CONFLICT DO NOTHING
    RETURNING id
)
SELECT r.*, a.seq, a.seen, a.anchor, a.horizon
FROM (
SELECT 'created' AS kind, id, NULL::text AS state FROM ins
UNION ALL
SELECT h.kind, h.id, h.state
FROM (
    SELECT 'key' AS kind, id, state FROM {live}
    WHERE topic = %(topic)s AND idempotency_key = %(key)s
    UNION ALL
    SELECT 'unique', id, state FROM {job}
    WHERE topic = %(topic)s AND unique_key = %(unique_key)s
      AND state IN ('scheduled', 'pending', 'processing', 'failed', 'blocked')
) AS h
WHERE NOT EXISTS (SELECT FROM ins)
UNION ALL
SELECT 'full', NULL, NULL FROM a WHERE NOT a.room
) AS r, a

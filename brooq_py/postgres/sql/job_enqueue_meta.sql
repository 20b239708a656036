-- name: job_enqueue_meta
-- The same statement with Job.meta stored: used only for jobs that carry meta, so that the
-- statement without it keeps working on a schema not yet migrated to 0010.
-- One job with an idempotency key, or of a depth-capped topic: a (topic, key)
-- already present inserts nothing (never a unique violation into the caller's
-- transaction: SPEC E1, E2). %(cap)s is the topic's max_depth as the Store
-- last read it (NULL: uncapped, and the depth is not read): a topic with that
-- many waiting jobs inserts nothing (SPEC F2), the count stopping at the cap
-- (the claim index for pending rows, the waiting index for the others).
-- Rows: (id, true) when inserted; (NULL, false) when the cap refused it;
-- none for a key already present. available_at defaults to the statement's
-- time, not the transaction's; a job due later than that is scheduled, and the
-- stager makes it pending (SPEC S5).
WITH a AS (
    SELECT coalesce(%(available_at)s::timestamptz, statement_timestamp()) AS at,
           CASE WHEN %(cap)s::int IS NULL THEN true
                ELSE (SELECT count(*) FROM (SELECT FROM {job} WHERE topic = %(topic)s AND state = 'pending'
                                            LIMIT %(cap)s) AS p)
                   + (SELECT count(*) FROM (SELECT FROM {job} WHERE topic = %(topic)s
                                                AND state IN ('scheduled', 'failed', 'blocked')
                                            LIMIT %(cap)s) AS w) < %(cap)s
           END AS room
), ins AS (
    INSERT INTO {job} (id, topic, payload, idempotency_key, meta, available_at, priority, state)
    SELECT %(id)s, %(topic)s, %(payload)s::jsonb, %(key)s, %(meta)s::jsonb, a.at, %(priority)s,
           CASE WHEN a.at > statement_timestamp() THEN 'scheduled' ELSE 'pending' END
    FROM a
    WHERE a.room
    ON CONFLICT (topic, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id
)
SELECT id, true FROM ins
UNION ALL
SELECT NULL, false FROM a WHERE NOT a.room

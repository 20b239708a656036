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
WITH n AS (
    SELECT CASE WHEN %(cap)s::int IS NOT NULL THEN pg_sequence_last_value(to_regclass({depth_seq})) END AS last
), r AS MATERIALIZED (
    SELECT coalesce(%(available_at)s::timestamptz, statement_timestamp()) AS at, n.last,
           CASE WHEN %(cap)s::int IS NULL
                  OR (n.last >= %(seq0)s::bigint AND %(base)s::bigint + (n.last - %(seq0)s::bigint) + 1 <= %(cap)s)
                THEN NULL
                ELSE (SELECT count(*) FROM (SELECT FROM {job} WHERE topic = %(topic)s AND state = 'pending'
                                            LIMIT %(cap)s) AS p)
                   + (SELECT count(*) FROM (SELECT FROM {job} WHERE topic = %(topic)s
                                                AND state IN ('scheduled', 'failed', 'blocked')
                                            LIMIT %(cap)s) AS w)
           END AS seen
    FROM n
), a AS (
    SELECT r.at, r.seen, r.seen IS NULL OR r.seen < %(cap)s AS room,
           CASE WHEN r.seen < %(cap)s AND %(cp_m)s::bigint <= txid_snapshot_xmax(txid_current_snapshot())
                     AND NOT EXISTS (SELECT FROM txid_snapshot_xip(txid_current_snapshot()) AS x(xid)
                                     WHERE x.xid < %(cp_m)s::bigint)
                THEN r.seen END AS anchor,
           CASE WHEN r.last IS NOT NULL AND current_setting('transaction_isolation') = 'read committed'
                THEN txid_snapshot_xmax(txid_current_snapshot()) END AS horizon,
           -- A job to write takes the transaction's id first, then its value (migration 0014).
           CASE WHEN %(cap)s::int IS NULL OR r.seen >= %(cap)s THEN NULL
                WHEN txid_current() IS NULL THEN NULL
                ELSE nextval(to_regclass({depth_seq})) END AS seq
    FROM r
), ins AS (
    INSERT INTO {job} (id, topic, payload, idempotency_key, unique_key, meta, available_at, priority, state)
    SELECT %(id)s, %(topic)s, %(payload)s::jsonb, %(key)s, %(unique_key)s, %(meta)s::jsonb, a.at, %(priority)s,
           CASE WHEN a.at > statement_timestamp() THEN 'scheduled' ELSE 'pending' END
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
    SELECT 'key' AS kind, id, state FROM {job}
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

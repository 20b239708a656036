-- name: job_enqueue
-- One job with an idempotency key, or of a depth-capped topic: a (topic, key)
-- already present inserts nothing (never a unique violation into the caller's
-- transaction: SPEC E1, E2).
-- SPEC F2: %(cap)s is the topic's max_depth as the Store last read it (NULL:
-- uncapped: nothing is counted). While the Store's anchor for the topic
-- (%(base)s waiting jobs, the depth sequence at %(seq0)s: migration 0014) plus
-- the values taken since, and this job, stays within the cap, there is room
-- and nothing is counted. Otherwise the waiting jobs are counted, stopping at
-- the cap (the claim index for pending rows, the waiting index for the
-- others), and a topic with that many inserts nothing. A job to write takes
-- its transaction's id, then the next value of the sequence (a refusal takes
-- neither, and commits nothing to flush). %(cp_m)s is the horizon of the
-- Store's checkpoint (see caps.py): when no other transaction below it is in
-- progress in this snapshot, every value below the checkpoint's is in this
-- count or was rolled back, and the count may anchor the Store. Each row ends
-- with (the value taken or NULL, the count or NULL, the count again if it may
-- anchor, this statement's horizon: the first transaction id not yet assigned
-- when its snapshot was taken, READ COMMITTED only).
-- Rows: (id, true, ...) when inserted; (NULL, false, ...) when the cap refused
-- it; none for a key already present. available_at defaults to the statement's
-- time, not the transaction's; a job due later than that is scheduled, and the
-- stager makes it pending (SPEC S5).
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
    INSERT INTO {job} (id, topic, payload, idempotency_key, available_at, priority, state)
    SELECT %(id)s, %(topic)s, %(payload)s::jsonb, %(key)s, a.at, %(priority)s,
           CASE WHEN a.at > statement_timestamp() THEN 'scheduled' ELSE 'pending' END
    FROM a
    WHERE a.room
    ON CONFLICT (topic, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id
)
SELECT ins.id, true, a.seq, a.seen, a.anchor, a.horizon FROM ins, a
UNION ALL
SELECT NULL, false, a.seq, a.seen, a.anchor, a.horizon FROM a WHERE NOT a.room

-- name: depth_room
-- SPEC F2: the depth cap's CTEs, shared by the enqueue statements that write one job
-- ({depth_room} in them; they follow with ")" and their own CTEs): n, the depth sequence's
-- last value; r, the job's time and, unless the Store's bound (%(base)s waiting jobs at
-- sequence %(seq0)s, migration 0014) proves room, the topic's waiting jobs counted up to
-- %(cap)s (depth_waiting.sql); a, whether there is room, the new anchor and horizon for the Store's bound, and
-- the sequence value a job to write takes (after its transaction's id). A count anchors only
-- in a transaction that had written nothing before it (r.wrote): one that had may have claimed,
-- canceled or deleted waiting jobs of the topic, which its count does not see and which come
-- back, with no value taken, if it rolls back.
n AS (
    SELECT CASE WHEN %(cap)s::int IS NOT NULL THEN pg_sequence_last_value(to_regclass({depth_seq})) END AS last
), r AS MATERIALIZED (
    SELECT coalesce(%(available_at)s::timestamptz, statement_timestamp()) AS at, n.last,
           txid_current_if_assigned() IS NOT NULL AS wrote,
           CASE WHEN %(cap)s::int IS NULL
                  OR (n.last >= %(seq0)s::bigint AND %(base)s::bigint + (n.last - %(seq0)s::bigint) + 1 <= %(cap)s)
                THEN NULL
                ELSE (SELECT d.waiting FROM (SELECT %(topic)s::text AS topic, %(cap)s::int AS cap) AS dt,
                                            LATERAL ({depth_waiting}) AS d)
           END AS seen
    FROM n
), a AS (
    SELECT r.at, r.seen, r.seen IS NULL OR r.seen < %(cap)s AS room,
           CASE WHEN r.seen < %(cap)s AND NOT r.wrote
                     AND %(cp_m)s::bigint <= txid_snapshot_xmax(txid_current_snapshot())
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

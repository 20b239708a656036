-- name: job_enqueue_capped
-- SPEC F2: a Store's own enqueue (autocommit) of a job without keys or parents
-- on a depth-capped topic for which the Store holds an anchor (see caps.py):
-- the plain insert, written only while the anchor's count %(base)s plus the
-- values of the depth sequence taken since %(seq0)s (this one's included: the
-- transaction's id first, then the value, migration 0013) stays within the cap
-- %(cap)s. Nothing is counted and nothing comes back: the command's row count
-- says whether it inserted (the id is the caller's). Not inserted: the caller
-- runs job_enqueue, which counts.
INSERT INTO {job} (id, topic, payload, meta, priority, available_at, state)
SELECT %(id)s, %(topic)s, %(payload)s::jsonb, %(meta)s::jsonb, %(priority)s,
       coalesce(%(available_at)s::timestamptz, statement_timestamp()),
       CASE WHEN %(available_at)s::timestamptz > statement_timestamp() THEN 'scheduled' ELSE 'pending' END
FROM (SELECT CASE WHEN txid_current() IS NULL THEN NULL ELSE nextval(to_regclass({depth_seq})) END AS seq) AS n
WHERE n.seq >= %(seq0)s::bigint AND %(base)s::bigint + (n.seq - %(seq0)s::bigint) <= %(cap)s

-- name: job_enqueue_capped
-- SPEC F2: a Store's own enqueue (autocommit) of a job without keys or parents
-- on a depth-capped topic for which the Store holds an anchor (see flow/limits.py):
-- the plain insert, written only while the anchor's count %(base)s plus the
-- values of the depth sequence taken since %(seq0)s, and this job, stays
-- within the cap %(cap)s (migration 0014). Nothing is counted and nothing
-- comes back: the command's row count says whether it inserted (the id is the
-- caller's). A job written takes its transaction's id, then its value; one not
-- written takes neither. Not inserted: the caller runs job_enqueue, which counts.
-- A sequence with no value yet (created again by migration 0014 after a downgrade:
-- its last value is NULL) proves nothing: not inserted.
INSERT INTO {job} (id, topic, payload, meta, priority, available_at, state{tenant_col})
SELECT %(id)s, %(topic)s, %(payload)s::jsonb, %(meta)s::jsonb, %(priority)s,
       coalesce(%(available_at)s::timestamptz, statement_timestamp()),
       CASE WHEN %(available_at)s::timestamptz > statement_timestamp() THEN 'scheduled' ELSE 'pending' END{tenant_param}
FROM (SELECT pg_sequence_last_value(to_regclass({depth_seq})) AS last) AS n
WHERE CASE WHEN NOT coalesce(n.last >= %(seq0)s::bigint
                              AND %(base)s::bigint + (n.last - %(seq0)s::bigint) + 1 <= %(cap)s, false)
                THEN false
           WHEN txid_current() IS NULL THEN false
           -- SPEC F3: on a parking topic, not while parked jobs wait (they go first)
           WHEN %(park)s::bool AND EXISTS (SELECT FROM {job} WHERE topic = %(topic)s AND state = 'parked')
                THEN false
           ELSE nextval(to_regclass({depth_seq})) IS NOT NULL END

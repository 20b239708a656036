-- name: job_retry_refusal
-- Why a retry changed nothing: the job's state, and the active job holding its
-- unique key (SPEC U3), if any, and a parent not done with its state, or one no longer
-- there (SPEC D2, D4), if any (for a group's finally_: a parent not ended), and a child its end is
-- not yet applied to (SPEC D3), if any.
-- No row: no such job.
SELECT j.state,
       (SELECT h.id::text FROM {job} h
        WHERE j.unique_key IS NOT NULL AND h.topic = j.topic AND h.unique_key = j.unique_key
          AND h.id <> j.id AND h.state IN ('scheduled', 'pending', 'processing', 'failed', 'blocked')
        LIMIT 1),
       j.unique_key,
       (SELECT x.id::text || coalesce(' is ' || p.state, ' no longer exists')
        FROM unnest(j.parents) AS x(id)
        LEFT JOIN {job} p ON p.id = x.id
        WHERE p.state IS DISTINCT FROM 'done'
          AND (j.parents_any_end AND p.state IN ('dead', 'canceled')) IS NOT TRUE
        LIMIT 1),
       (SELECT w.child::text FROM {job_wait} w WHERE w.parent = j.id LIMIT 1)
FROM {job} j
WHERE j.id = %(id)s

-- name: job_parent_results
-- SPEC D4: each parent's result by id (Claim.parent_results): the job's parents array,
-- then each parent by primary key. Retention keeps a done parent while a child naming
-- it is active, so every parent of a running job is found.
SELECT p.id::text, p.result
FROM {job} c
CROSS JOIN LATERAL unnest(c.parents) AS x(id)
JOIN {job} p ON p.id = x.id
WHERE c.id = %(id)s

-- name: job_parent_results
-- SPEC D4, BD2, BD3: each parent of a job in the order it names them (its parents array:
-- its own Job.after, then its group's jobs in group order), with the parent's result, state
-- and the name its group gave it (NULL for none, and for every parent of a row written
-- without names), by primary key. Two jobs of a group that found one row by their key
-- are there once each, under each one's name. Retention keeps a parent while a child
-- naming it is active, so every parent of a running job is found.
SELECT p.id::text, p.result, p.state, c.parent_names[x.n]
FROM {job} c
CROSS JOIN LATERAL unnest(c.parents) WITH ORDINALITY AS x(id, n)
JOIN {job} p ON p.id = x.id
WHERE c.id = %(id)s
ORDER BY x.n

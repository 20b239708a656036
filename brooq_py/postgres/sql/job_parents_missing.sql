-- name: job_parents_missing
-- The first of %(parents)s this transaction cannot see (none: no row). enqueue_group
-- checks the parents its `then` names itself before the group is written, so that
-- a refused `then` leaves nothing of the group in the caller's transaction (SPEC D1).
SELECT x.id
FROM unnest(%(parents)s::uuid[]) WITH ORDINALITY AS x(id, n)
WHERE NOT EXISTS (SELECT FROM {job} j WHERE j.id = x.id)
ORDER BY x.n
LIMIT 1

-- name: web_job_relatives
-- The job page's parents and children (SPEC D3): the parents from the job's own
-- array (primary key probes), the children from job_edge's primary key, at most
-- %(limit)s of them. One row each: ('parent' or 'child', id, topic, state); a parent the
-- array holds twice (two jobs of a group that found one row by their key, SPEC BD3) once.
SELECT 'parent', p.id::text, p.topic, p.state
FROM {job} c
CROSS JOIN LATERAL unnest(c.parents) WITH ORDINALITY AS x(id, n)
JOIN {job} p ON p.id = x.id
WHERE c.id = %(id)s AND x.n = array_position(c.parents, x.id)
UNION ALL
(SELECT 'child', c.id::text, c.topic, c.state
 FROM {job_edge} e
 JOIN {job} c ON c.id = e.child
 WHERE e.parent = %(id)s
 ORDER BY e.child
 LIMIT %(limit)s)

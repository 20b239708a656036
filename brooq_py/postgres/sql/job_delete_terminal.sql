-- name: job_delete_terminal
-- SPEC T1, T2: one batch of terminal rows older than the ttl, oldest first.
-- SPEC D4: a parent goes only once every child naming it is terminal, so a running
-- child always finds its parents' results (one probe of job_edge's primary key per
-- candidate: a child may name a parent that had already ended, which is never
-- written, so the row itself cannot tell); a row's edges go with it (to its children
-- through the primary key, to its parents through job_edge_child_idx).
-- A parent locked by an enqueue naming it is skipped (SKIP LOCKED); one deleted
-- first makes that enqueue's parent unknown (InvalidJob).
WITH doomed AS (
    SELECT j.id
    FROM {job} j
    WHERE j.state IN ('done', 'dead', 'canceled') AND j.updated_at < now() - %(ttl)s::interval
      AND NOT EXISTS (SELECT FROM {job_edge} e JOIN {job} c ON c.id = e.child
                      WHERE e.parent = j.id AND c.state NOT IN ('done', 'dead', 'canceled'))
    ORDER BY j.updated_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
), deleted AS (
    DELETE FROM {job} j
    USING doomed d
    WHERE j.id = d.id
    RETURNING j.id, j.topic, j.parents IS NOT NULL AS has_parents
), below AS (
    DELETE FROM {job_edge} e USING deleted d WHERE e.parent = d.id
), above AS (
    DELETE FROM {job_edge} e USING deleted d WHERE d.has_parents AND e.child = d.id
)
SELECT id, topic FROM deleted

-- name: job_delete_terminal
-- SPEC T1, T2: one batch of terminal rows older than the ttl, oldest first.
-- SPEC D4: a parent (has_children) goes only once every child naming it is
-- terminal, so a running child always finds its parents' results; a row's edges
-- go with it (to its children through the primary key, to its parents through
-- job_edge_child_idx). Rows without parents or children pay no edge lookup.
-- A parent locked by an enqueue naming it is skipped (SKIP LOCKED); one deleted
-- first makes that enqueue's parent unknown (InvalidJob).
WITH doomed AS (
    SELECT j.id
    FROM {job} j
    WHERE j.state IN ('done', 'dead', 'canceled') AND j.updated_at < now() - %(ttl)s::interval
      AND (NOT j.has_children OR NOT EXISTS (
               SELECT FROM {job_edge} e JOIN {job} c ON c.id = e.child
               WHERE e.parent = j.id AND c.state NOT IN ('done', 'dead', 'canceled')))
    ORDER BY j.updated_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
), deleted AS (
    DELETE FROM {job} j
    USING doomed d
    WHERE j.id = d.id
    RETURNING j.id, j.topic, j.has_children, j.parents IS NOT NULL AS has_parents
), below AS (
    DELETE FROM {job_edge} e USING deleted d WHERE d.has_children AND e.parent = d.id
), above AS (
    DELETE FROM {job_edge} e USING deleted d WHERE d.has_parents AND e.child = d.id
)
SELECT id, topic FROM deleted

-- name: job_delete_terminal
-- SPEC T1, T2: deletes the rows job_terminal_lock locked, in the same transaction.
-- SPEC D4, Q5: terminal_kept.sql again, in this statement's snapshot, taken after those locks
-- were granted: it sees every child committed before them, so a row that has become the parent
-- of an active child since the first statement's snapshot is kept (an enqueue naming it between
-- the two snapshots; no enqueue can lock it now until this commit). A row's edges go with it (to its children
-- through the primary key, to its parents through job_edge_child_idx). DS5: its recorded steps
-- and its signals too (their primary keys lead by the job; no foreign key, so no cascade locks).
WITH deleted AS (
    DELETE FROM {live} j
    WHERE j.id = ANY (%(ids)s::uuid[])
      AND NOT {terminal_kept}
    RETURNING j.id, j.topic, j.parents IS NOT NULL AS has_parents
), below AS (
    DELETE FROM {job_edge} e USING deleted d WHERE e.parent = d.id
), above AS (
    DELETE FROM {job_edge} e USING deleted d WHERE d.has_parents AND e.child = d.id
), steps AS (
    DELETE FROM {job_step} s USING deleted d WHERE s.job_id = d.id
), signals AS (
    DELETE FROM {job_signal} g USING deleted d WHERE g.job_id = d.id
)
SELECT id, topic FROM deleted

-- name: history_keep
-- SPEC B2, D4, Q5: before a day's table of history is dropped, the rows that retention would keep
-- go back to the job table, where retention deletes them row by row once it may: a parent named by
-- an active child (a child enqueued after its parent had moved here), a dead member that halts its
-- sequence. Run under the table's ACCESS EXCLUSIVE lock, before history_forget: every enqueue or
-- retry that named one of its rows as a parent has committed (it held the table while it read the
-- row) and this statement's snapshot, taken after the lock, sees its child.
WITH kept AS (
    DELETE FROM ONLY {history} j
    WHERE j.id IN (SELECT e.parent FROM {job_edge} e JOIN {live} c ON c.id = e.child
                   WHERE c.state NOT IN ('done', 'dead', 'canceled'))
       OR (j.sequence IS NOT NULL AND j.state = 'dead'
           AND j.id IN (SELECT h.job FROM {job_sequence_halt} h WHERE h.topic = j.topic AND h.sequence = j.sequence))
    RETURNING j.*
)
INSERT INTO {job}
SELECT * FROM kept
RETURNING id

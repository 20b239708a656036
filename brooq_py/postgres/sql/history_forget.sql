-- name: history_forget
-- SPEC B2, T1, DS5: what names the jobs of a day's table of history goes with it: their edges (to
-- their children, to their parents), their recorded steps, their signals. Run after history_keep,
-- before the table's lock is taken (rows deleted here leave no job that names them: an edge made
-- since names a parent that history_keep, run again under the lock, takes back). Answers the rows
-- the table holds.
WITH below AS (
    DELETE FROM {job_edge} e USING {history} d WHERE e.parent = d.id
), above AS (
    DELETE FROM {job_edge} e USING {history} d WHERE d.parents IS NOT NULL AND e.child = d.id
), steps AS (
    DELETE FROM {job_step} s USING {history} d WHERE s.job_id = d.id
), signals AS (
    DELETE FROM {job_signal} g USING {history} d WHERE g.job_id = d.id
)
SELECT count(*) FROM {history}

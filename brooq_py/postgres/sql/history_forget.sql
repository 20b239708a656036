-- name: history_forget
-- SPEC B2, T1, DS5: what names the jobs of a day's table of history goes with it: their edges (to
-- their children, to their parents), their recorded steps, their signals. Run under the table's
-- ACCESS EXCLUSIVE lock, after history_keep, in the transaction that drops it. Answers the rows the
-- table holds.
WITH below AS (
    DELETE FROM {job_edge} e USING ONLY {history} d WHERE e.parent = d.id
), above AS (
    DELETE FROM {job_edge} e USING ONLY {history} d WHERE d.parents IS NOT NULL AND e.child = d.id
), steps AS (
    DELETE FROM {job_step} s USING ONLY {history} d WHERE s.job_id = d.id
), signals AS (
    DELETE FROM {job_signal} g USING ONLY {history} d WHERE g.job_id = d.id
)
SELECT topic, count(*) FROM ONLY {history} GROUP BY topic

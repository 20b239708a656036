-- name: history_drop
-- SPEC B2, T1: a day of terminal history goes whole, without a dead row version per job (migration
-- 0025's job_history_drop, run as the owner of job for a session that may delete from job).
SELECT {job_history_drop}(%(day)s)

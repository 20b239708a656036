-- name: topic_limit_writers
-- SPEC Q3: the transactions, begun before this statement, that hold a write lock on the job table:
-- among them any claim that ran before a new limit committed (its snapshot did not see it). A
-- claim that takes the table's lock later takes its snapshot after it, and sees the limit.
SELECT DISTINCT a.pid, a.xact_start
FROM pg_locks l
JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'relation' AND l.relation = '{job}'::regclass AND l.mode = 'RowExclusiveLock'
    AND l.granted AND a.pid <> pg_backend_pid() AND a.xact_start < now()

-- name: topic_limit_writers
-- SPEC Q3: the transactions, begun before this statement, that hold a write lock on the job table:
-- among them any claim that ran before a new limit committed (its snapshot did not see it). A
-- claim that takes the table's lock later takes its snapshot after it, and sees the limit.
SELECT DISTINCT a.pid, a.xact_start
FROM pg_locks l
JOIN pg_stat_activity a ON a.pid = l.pid
JOIN pg_class c ON c.oid = l.relation
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE l.locktype = 'relation' AND n.nspname = %(schema)s AND c.relname = 'job'
    AND l.mode = 'RowExclusiveLock' AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
    AND l.granted AND a.pid <> pg_backend_pid() AND a.xact_start < now()

-- name: topic_limit_writers_left
-- SPEC Q3: how many of the transactions topic_limit_writers listed still run.
SELECT count(*)
FROM pg_stat_activity a
JOIN unnest(%(pids)s::int[], %(starts)s::timestamptz[]) AS w(pid, xact_start)
    ON a.pid = w.pid AND a.xact_start = w.xact_start

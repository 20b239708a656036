-- name: stats_dead
-- The most recent dead jobs: the retention index (terminal rows by updated_at)
-- read backwards, stopped at the limit.
SELECT id, topic, attempts, last_error, updated_at
FROM {job}
WHERE state = 'dead'
ORDER BY updated_at DESC
LIMIT %(limit)s

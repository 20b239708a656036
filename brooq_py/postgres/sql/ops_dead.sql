-- name: ops_dead
-- Dead jobs, newest first: to be sorted out by hand.
SELECT id, topic, attempts, last_error, updated_at
FROM {job}
WHERE state = 'dead'
ORDER BY updated_at DESC
LIMIT 20

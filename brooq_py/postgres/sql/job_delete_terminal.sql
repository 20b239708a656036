-- name: job_delete_terminal
-- SPEC T1, T2: one batch of terminal rows older than the ttl, oldest first.
DELETE FROM {job}
WHERE id IN (
    SELECT id
    FROM {job}
    WHERE state IN ('done', 'dead', 'canceled') AND updated_at < now() - %(ttl)s::interval
    ORDER BY updated_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
)
RETURNING id, topic

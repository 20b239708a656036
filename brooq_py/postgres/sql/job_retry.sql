-- name: job_retry
-- SPEC Q1: a dead or canceled job back to pending, attempts 0, due now, last_error kept;
-- any other state is left alone. The notification wakes the engines of its topic.
WITH retried AS (
    UPDATE {job}
    SET state = 'pending', attempts = 0, available_at = now(), locked_by = NULL, locked_until = NULL,
        updated_at = now()
    WHERE id = %(id)s AND state IN ('dead', 'canceled')
    RETURNING id, topic
)
SELECT id, pg_notify({channel_literal}, topic) FROM retried

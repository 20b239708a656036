-- name: job_get_by_key
-- The job holding (topic, key). Run as a new statement after a skipped insert,
-- so its snapshot sees a duplicate committed concurrently.
SELECT id FROM {live} WHERE topic = %(topic)s AND idempotency_key = %(key)s

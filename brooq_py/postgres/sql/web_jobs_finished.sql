-- name: web_jobs_finished
-- One page of finished jobs (done, dead or canceled) of one state, newest first, of one
-- topic or of every topic (topic NULL): the retention index (terminal rows by updated_at)
-- read backwards from the keyset (after_at, after_id) and stopped at the limit.
SELECT id, topic, state, attempts, priority, available_at, locked_until, last_error, created_at, updated_at,
       -- The payload's first characters, from small payloads only: a large one is not detoasted.
       CASE WHEN pg_column_size(payload) <= 2048 THEN left(payload::text, 160) END, pg_column_size(payload)
FROM {job}
WHERE state = %(state)s AND state IN ('done', 'dead', 'canceled')
  AND (%(topic)s::text IS NULL OR topic = %(topic)s::text)
  AND updated_at <= coalesce(%(after_at)s::timestamptz, 'infinity')
  AND (updated_at, id) < (coalesce(%(after_at)s::timestamptz, 'infinity'),
                          coalesce(%(after_id)s::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff'))
ORDER BY updated_at DESC, id DESC
LIMIT %(limit)s

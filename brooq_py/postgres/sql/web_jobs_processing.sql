-- name: web_jobs_processing
-- One page of a topic's processing jobs, latest lease end first: the lease index
-- (partial on processing, by locked_until), whose rows are bounded by the running
-- workers, read backwards from the keyset (after_at, after_id).
SELECT id, topic, state, attempts, priority, available_at, locked_until, last_error, created_at, updated_at,
       -- The payload's first characters, from small payloads only: a large one is not detoasted.
       CASE WHEN pg_column_size(payload) <= 2048 THEN left(payload::text, 160) END, pg_column_size(payload)
FROM {job}
WHERE state = 'processing' AND topic = %(topic)s
  AND locked_until <= coalesce(%(after_at)s::timestamptz, 'infinity')
  AND (locked_until, id) < (coalesce(%(after_at)s::timestamptz, 'infinity'),
                            coalesce(%(after_id)s::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff'))
ORDER BY locked_until DESC, id DESC
LIMIT %(limit)s

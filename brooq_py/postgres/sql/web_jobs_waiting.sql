-- name: web_jobs_waiting
-- One page of a topic's waiting jobs (pending, scheduled or failed), the last to be
-- claimed first: the claim index (topic, priority DESC, available_at, id) read backwards
-- from the keyset (after_priority, after_at, after_id); NULLs start at the first page.
-- The keyset is written without OR-ed NULL tests so that it stays an index bound.
SELECT id, topic, state, attempts, priority, available_at, locked_until, last_error, created_at, updated_at,
       -- The payload's first characters, from small payloads only: a large one is not detoasted.
       CASE WHEN pg_column_size(payload) <= 2048 THEN left(payload::text, 160) END, pg_column_size(payload)
FROM {job}
WHERE topic = %(topic)s AND state = %(state)s
  AND priority >= coalesce(%(after_priority)s::int, -2147483648)
  AND (priority > coalesce(%(after_priority)s::int, -2147483648)
       OR (available_at, id) < (coalesce(%(after_at)s::timestamptz, 'infinity'),
                                coalesce(%(after_id)s::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff')))
ORDER BY priority, available_at DESC, id DESC
LIMIT %(limit)s

-- name: job_list_payload
-- job_list with a payload filter: the jobs whose payload contains the given JSON
-- (jsonb containment: a filter of user_id 7 matches a payload of user_id 7 and lang fr),
-- newest first (the `jobs --payload` command). An operator's read: no index serves the
-- containment, so it walks the key (within the topic and state when given) until `limit`
-- rows match.
SELECT id, topic, payload, state, attempts, priority, available_at, locked_by, locked_until,
       last_error, idempotency_key, created_at, updated_at, unique_key, parents
FROM {job}
WHERE (%(topic)s::text IS NULL OR topic = %(topic)s)
  AND (%(state)s::text IS NULL OR state = %(state)s)
  AND payload @> %(payload)s::jsonb
ORDER BY id DESC
LIMIT %(limit)s

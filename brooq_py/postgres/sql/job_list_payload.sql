-- name: job_list_payload
-- job_list with a payload filter: the jobs whose payload contains the given JSON
-- (jsonb containment: a filter of user_id 7 matches a payload of user_id 7 and lang fr),
-- newest first (the `jobs --payload` command), each row as job_get reads it. An operator's
-- read: no index serves the containment, so it walks the key (within the topic and state when
-- given) until `limit` rows match.
SELECT {job_row_columns}
FROM {job} j
CROSS JOIN LATERAL (SELECT to_jsonb(j) AS doc) AS r
WHERE (%(topic)s::text IS NULL OR j.topic = %(topic)s)
  AND (%(state)s::text IS NULL OR j.state = %(state)s)
  AND (%(tenant)s::text IS NULL OR r.doc ->> 'tenant' = %(tenant)s)
  AND j.payload @> %(payload)s::jsonb
ORDER BY j.id DESC
LIMIT %(limit)s

-- name: job_list
-- The newest jobs first (ids are UUIDv7: the primary key read backwards), of one
-- topic, one state and/or one tenant when given (the `jobs` command), each row as job_get reads
-- it. An operator's read: with a filter it walks the key until `limit` rows match.
SELECT {job_row_columns}
FROM {job} j
CROSS JOIN LATERAL (SELECT to_jsonb(j) AS doc) AS r
WHERE (%(topic)s::text IS NULL OR j.topic = %(topic)s)
  AND (%(state)s::text IS NULL OR j.state = %(state)s)
  AND (%(tenant)s::text IS NULL OR r.doc ->> 'tenant' = %(tenant)s)
ORDER BY j.id DESC
LIMIT %(limit)s

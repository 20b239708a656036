-- name: job_get
-- The row as JobRow has it, in one SELECT: its result, attempt history and progress
-- included (NOTES: no separate delivery log). Columns of migration 0010 and later are
-- read through to_jsonb, so a producer on a schema not yet migrated still reads its
-- jobs (NULL there); the 14th column stands where job_list has unique_key.
SELECT j.id, j.topic, j.payload, j.state, j.attempts, j.priority, j.available_at, j.locked_by,
       j.locked_until, j.last_error, j.idempotency_key, j.created_at, j.updated_at,
       NULL::text AS unique_key, r.doc -> 'parents' AS parents,
       r.doc -> 'result' AS result, r.doc -> 'errors' AS errors, r.doc -> 'progress' AS progress,
       r.doc ->> 'progress_note' AS progress_note, r.doc -> 'meta' AS meta
FROM {job} j
CROSS JOIN LATERAL (SELECT to_jsonb(j) AS doc) AS r
WHERE j.id = %(id)s

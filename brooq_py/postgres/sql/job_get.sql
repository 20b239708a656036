-- name: job_get
-- The row as JobRow has it, in one SELECT: its result, attempt history and progress
-- included (NOTES: no separate delivery log).
SELECT {job_row_columns}
FROM {job} j
CROSS JOIN LATERAL (SELECT to_jsonb(j) AS doc) AS r
WHERE j.id = %(id)s

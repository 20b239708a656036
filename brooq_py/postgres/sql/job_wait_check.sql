-- name: job_wait_check
-- SPEC V2: one statement per wake-up for every id waited on: which still exist and
-- in what state (an id missing from the answer was never there or was deleted).
SELECT id::text, state
FROM {job}
WHERE id = ANY (%(ids)s::uuid[])

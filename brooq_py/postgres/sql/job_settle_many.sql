-- name: job_settle_many
-- SPEC P3, C10: many outcomes, each guarded by state and its claim's token;
-- rows no longer ours (canceled, reaped, claimed again) are left alone.
-- Rows are found by primary key (id = ANY). The state guard is compared with a
-- column of the fenced subquery (OFFSET 0), not a literal, so the planner cannot
-- serve the update from the partial lease index instead: that index keeps an entry
-- for every row that was processing until VACUUM, and a bitmap scan of it made each
-- write cost O(jobs done since the last vacuum) - 34 ms a batch 15k jobs into a drain.
UPDATE {job} j
SET state = u.state,
    attempts = CASE WHEN u.give_back THEN greatest(j.attempts - 1, 0) ELSE j.attempts END,
    available_at = CASE WHEN u.state IN ('failed', 'pending') THEN now() + make_interval(secs => u.delay)
                        ELSE j.available_at END,
    last_error = coalesce(u.error, j.last_error),
    locked_by = CASE WHEN u.state = 'pending' THEN NULL ELSE j.locked_by END,
    locked_until = CASE WHEN u.state = 'pending' THEN NULL ELSE j.locked_until END,
    updated_at = now()
FROM (
    SELECT o.*, 'processing'::text AS guard
    FROM unnest(%(ids)s::uuid[], %(tokens)s::uuid[], %(states)s::text[], %(delays)s::float8[],
                %(give_back)s::bool[], %(errors)s::text[]) AS o(id, token, state, delay, give_back, error)
    OFFSET 0
) AS u
WHERE j.id = ANY (%(ids)s::uuid[]) AND j.id = u.id AND j.state = u.guard AND j.claim_token = u.token
RETURNING j.id::text

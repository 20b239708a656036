-- name: lease_renew
-- SPEC C3: every lease still ours in one statement; ids only, never payloads.
-- Found by primary key, the state guard hidden from the planner as in job_settle_many
-- (the partial lease index holds dead entries until VACUUM).
UPDATE {job} j
SET locked_until = now() + %(lease)s::interval
FROM (
    SELECT h.*, 'processing'::text AS guard
    FROM unnest(%(ids)s::uuid[], %(tokens)s::uuid[]) AS h(id, token)
    OFFSET 0
) AS u
WHERE j.id = ANY (%(ids)s::uuid[]) AND j.id = u.id AND j.state = u.guard AND j.claim_token = u.token
RETURNING j.id::text

-- name: lease_renew
-- SPEC C3, L3: every lease still ours in one statement; ids only, never payloads.
-- Rows locked by someone else (an operator's open transaction in psql, a closing
-- transaction) are skipped, never waited for, and still returned: the lease is
-- still ours, only not renewed this time. Found by primary key, the state guard
-- hidden from the planner in a materialized CTE (the partial lease index holds dead
-- entries until VACUUM).
WITH held AS MATERIALIZED (
    SELECT h.id, h.token, 'processing'::text AS guard
    FROM unnest(%(ids)s::uuid[], %(tokens)s::uuid[]) AS h(id, token)
), free AS MATERIALIZED (
    SELECT j.id
    FROM {job} j
    JOIN held h ON j.id = h.id
    WHERE j.id = ANY (%(ids)s::uuid[]) AND j.state = h.guard AND j.claim_token = h.token
    FOR NO KEY UPDATE OF j SKIP LOCKED
), renewed AS (
    UPDATE {job} j
    SET locked_until = now() + %(lease)s::interval
    FROM free
    WHERE j.id = free.id
    RETURNING j.id
)
SELECT id::text FROM renewed
UNION ALL
SELECT j.id::text
FROM {job} j
JOIN held h ON j.id = h.id
WHERE j.id = ANY (%(ids)s::uuid[]) AND j.state = h.guard AND j.claim_token = h.token
    AND j.id NOT IN (SELECT id FROM free)

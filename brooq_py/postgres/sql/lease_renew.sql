-- name: lease_renew
-- SPEC C3, L3: every lease still ours in one statement; ids only, never payloads.
-- Rows locked by someone else (an operator's open transaction in psql, a closing
-- transaction) are skipped, never waited for, and still returned: the lease is
-- still ours, only not renewed this time. Found by primary key, the state guard
-- hidden from the planner in a materialized CTE (the partial lease index holds dead
-- entries until VACUUM).
-- V4: progress and progress_note reported since the last renewal ride along (NULL:
-- unchanged); a row skipped as locked keeps its old ones.
WITH held AS MATERIALIZED (
    SELECT h.id, h.token, h.progress, h.note, 'processing'::text AS guard
    FROM unnest(%(ids)s::uuid[], %(tokens)s::uuid[], %(progress)s::real[], %(notes)s::text[])
        AS h(id, token, progress, note)
), free AS MATERIALIZED (
    SELECT j.id, h.progress, h.note
    FROM {job} j
    JOIN held h ON j.id = h.id
    WHERE j.id = ANY (%(ids)s::uuid[]) AND j.state = h.guard AND j.claim_token = h.token
    FOR NO KEY UPDATE OF j SKIP LOCKED
), renewed AS (
    UPDATE {job} j
    SET locked_until = now() + %(lease)s::interval,
        progress = coalesce(free.progress, j.progress),
        progress_note = coalesce(free.note, j.progress_note)
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

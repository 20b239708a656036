-- name: lease_renew
-- SPEC C3: every lease still ours in one statement; ids only, never payloads.
UPDATE {job} j
SET locked_until = now() + %(lease)s::interval
FROM unnest(%(ids)s::uuid[], %(tokens)s::uuid[]) AS u(id, token)
WHERE j.id = u.id AND j.state = 'processing' AND j.claim_token = u.token
RETURNING j.id::text

-- name: lease_reap
-- SPEC R1, P1': expired leases back to pending, attempts unchanged; only rows the reaper saw
-- expired before and still unchanged (same claim token, same locked_until: no renewal came),
-- never a row locked by someone else (SKIP LOCKED, never waited for), never a claim whose
-- guard is held: the engine holding it guards a claim whose row it found locked at a renewal
-- (lease_renew.sql), on its own session, until the lease is extended again; the guard goes
-- with that session when the engine dies. The guard is tried (never waited for) only for the
-- rows about to be returned, and held until this statement ends, so a renewal cannot take it
-- in between. Guarded by state, so terminal rows (which keep their old locked_until) are
-- never resurrected.
WITH seen AS MATERIALIZED (
    SELECT s.id, s.token, s.until, 'processing'::text AS guard
    FROM unnest(%(ids)s::uuid[], %(tokens)s::text[], %(untils)s::timestamptz[]) AS s(id, token, until)
), ripe AS MATERIALIZED (
    SELECT j.id, s.token
    FROM {job} j
    JOIN seen s ON j.id = s.id
    WHERE j.id = ANY (%(ids)s::uuid[]) AND j.state = s.guard AND coalesce(j.claim_token::text, '') = s.token
        AND j.locked_until = s.until AND j.locked_until < now()
    FOR NO KEY UPDATE OF j SKIP LOCKED
)
UPDATE {job} j
SET state = 'pending', locked_by = NULL, locked_until = NULL, available_at = now(), updated_at = now()
FROM ripe
WHERE j.id = ripe.id AND pg_try_advisory_xact_lock({guard_class}, hashtext(ripe.token))
RETURNING j.id::text, j.topic

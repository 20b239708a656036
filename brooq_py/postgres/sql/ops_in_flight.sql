-- name: ops_in_flight
-- What is in flight right now and who holds it (partial index on processing).
-- `locked_until` is the claim time plus the lease (engines of 0.4 do not move it), so
-- `lease_expired` is the reaper's test only for a row whose engine has no row in `engine`;
-- the view job_in_flight has the reaper's test for every row (SPEC P1'').
SELECT id, topic, locked_by, locked_until, attempts, locked_until < now() AS lease_expired
FROM {job}
WHERE state = 'processing'
ORDER BY locked_until
LIMIT 100

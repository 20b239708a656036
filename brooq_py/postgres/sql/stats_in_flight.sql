-- name: stats_in_flight
-- Processing rows, soonest lease end first (the lease-expiry index, partial on
-- processing). `locked_until` is the claim time plus the lease (engines of 0.4 do not
-- move it): `expired` is the reaper's test only for a row whose engine has no row in
-- `engine`; the view job_in_flight has the reaper's test for every row (SPEC P1'').
SELECT id, topic, locked_by, locked_until, attempts, locked_until < now() AS expired
FROM {job}
WHERE state = 'processing'
ORDER BY locked_until
LIMIT %(limit)s

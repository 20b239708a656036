-- name: ops_in_flight
-- What is in flight right now, who holds it, and whether the reaper may take it back: the view
-- job_in_flight reads each claim's engine row (SPEC P1'').
SELECT id, topic, locked_by, lease_until, attempts, expired AS lease_expired
FROM {job_in_flight}
ORDER BY lease_until
LIMIT 100

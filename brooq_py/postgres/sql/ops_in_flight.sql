-- name: ops_in_flight
-- What is in flight right now and who holds it (partial index on processing).
SELECT id, topic, locked_by, locked_until, attempts, locked_until < now() AS lease_expired
FROM {job}
WHERE state = 'processing'
ORDER BY locked_until
LIMIT 100

-- name: stats_in_flight
-- Processing rows, soonest lease end first (the lease-expiry index, partial on
-- processing); `expired` rows are what the next reaper pass returns to pending.
SELECT id, topic, locked_by, locked_until, attempts, locked_until < now() AS expired
FROM {job}
WHERE state = 'processing'
ORDER BY locked_until
LIMIT %(limit)s

-- name: stats_in_flight
-- Processing rows, soonest lease end first, from the view job_in_flight (each claim's engine row:
-- its last proof of life plus its lease); `expired` rows are what the next reaper pass returns.
SELECT id, topic, locked_by, lease_until, attempts, expired
FROM {job_in_flight}
ORDER BY lease_until
LIMIT %(limit)s

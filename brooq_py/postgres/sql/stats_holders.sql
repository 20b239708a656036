-- name: stats_holders
-- Who holds the processing rows: one line per engine (host:pid:id), with when its claims' lease
-- ends (its last proof of life plus its lease). Reads only the processing rows.
SELECT locked_by, count(*) AS jobs, min(lease_until) AS next_lease_end
FROM {job_in_flight}
GROUP BY locked_by
ORDER BY locked_by
LIMIT %(limit)s

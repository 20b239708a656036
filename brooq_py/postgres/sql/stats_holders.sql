-- name: stats_holders
-- Who holds the processing rows: one line per worker identity (host:pid:engine).
-- Reads only the processing rows, which the running workers bound.
SELECT locked_by, count(*) AS jobs, min(locked_until) AS next_lease_end
FROM {job}
WHERE state = 'processing'
GROUP BY locked_by
ORDER BY locked_by
LIMIT %(limit)s

-- name: ops_depth
-- Queue depth by topic and state (a full scan: for psql, not for a scrape loop).
SELECT topic, state, count(*) AS jobs
FROM {job}
GROUP BY topic, state
ORDER BY topic, state

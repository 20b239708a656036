-- name: web_activity
-- The dashboard's last hour: terminal rows by topic, state and minute. Read from the
-- retention index (terminal rows by updated_at) backwards and stopped at `cap` rows,
-- so its cost follows the last hour's outcomes up to the cap, never the table.
SELECT recent.topic, recent.state,
       least(59, floor(extract(epoch FROM now() - recent.updated_at) / 60))::int AS minutes_ago,
       count(*)::int AS jobs
FROM (SELECT j.topic, j.state, j.updated_at
      FROM {job} j
      WHERE j.state IN ('done', 'dead', 'canceled') AND j.updated_at > now() - interval '1 hour'
      ORDER BY j.updated_at DESC
      LIMIT %(cap)s) AS recent
GROUP BY 1, 2, 3

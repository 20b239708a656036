-- name: job_next_due
-- SPEC S7: seconds until the earliest scheduled or failed row of the topics is
-- due, by the database clock (<= 0 when one is due already; NULL when none
-- waits). One probe of the stage index per topic; no lock, no write.
SELECT extract(epoch FROM min(n.at) - clock_timestamp())::float8
FROM unnest(%(topics)s::text[]) AS t(topic)
CROSS JOIN LATERAL (
    SELECT min(j.available_at) AS at
    FROM {job} j
    WHERE j.topic = t.topic AND j.state IN ('scheduled', 'failed')
) AS n

-- name: job_next_retry
-- Seconds until the earliest failed row of the topics is due for its retry, by the database
-- clock (<= 0: due already; NULL: no retry waits). Scheduled rows are not counted: a burst
-- worker waits out retries, not jobs planned for later. One probe of the stage index per topic.
SELECT extract(epoch FROM min(n.at) - clock_timestamp())::float8
FROM unnest(%(topics)s::text[]) AS t(topic)
CROSS JOIN LATERAL (
    SELECT min(j.available_at) AS at
    FROM {job} j
    WHERE j.topic = t.topic AND j.state = 'failed'
) AS n

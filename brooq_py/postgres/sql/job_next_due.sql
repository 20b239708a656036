-- name: job_next_due
-- SPEC S7: seconds until the earliest scheduled or failed row of the topics is
-- due, by the database clock (<= 0 when one is due already; NULL when none
-- waits). One probe of the stage index per topic; no lock, no write.
-- SPEC DS4: due now while a signal is owed to a job that is not running (a probe of the
-- partial index of signals the stager has yet to look at: empty while none is).
SELECT CASE WHEN EXISTS (SELECT FROM {job_signal} g LEFT JOIN {job} w ON w.id = g.job_id
                         WHERE NOT g.woke AND (w.id IS NULL OR w.state <> 'processing'))
            THEN -1::float8
            ELSE extract(epoch FROM min(n.at) - clock_timestamp())::float8 END
FROM unnest(%(topics)s::text[]) AS t(topic)
CROSS JOIN LATERAL (
    SELECT min(j.available_at) AS at
    FROM {job} j
    WHERE j.topic = t.topic AND j.state IN ('scheduled', 'failed')
) AS n

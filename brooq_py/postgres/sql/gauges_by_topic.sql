-- name: gauges_by_topic
-- SPEC O1: per topic, active-state depth (each count capped at `cap` index
-- entries; scheduled and failed rows are read on the stage index) and the oldest ready age in seconds (0 when nothing is ready).
-- The oldest ready job is found on the claim index (topic, priority DESC,
-- available_at, id) by a skip scan: one probe per distinct priority of the
-- topic's ready jobs (at most 64 of them), then the earliest available_at
-- under each. No second index on (topic, available_at) is needed: such an
-- index tempts the planner away from the claim index when statistics lag.
SELECT t.topic,
       (SELECT count(*) FROM (SELECT 1 FROM {job} j WHERE j.topic = t.topic AND j.state = 'pending'
                              LIMIT %(cap)s) AS s) AS pending,
       (SELECT count(*) FROM (SELECT 1 FROM {job} j WHERE j.topic = t.topic AND j.state = 'processing'
                              LIMIT %(cap)s) AS s) AS processing,
       (SELECT count(*) FROM (SELECT 1 FROM {job} j WHERE j.topic = t.topic AND j.state = 'failed'
                              LIMIT %(cap)s) AS s) AS failed,
       coalesce(extract(epoch FROM now() - (
           WITH RECURSIVE prio(p, n) AS (
               (SELECT j.priority, 1 FROM {job} j
                WHERE j.topic = t.topic AND j.state = 'pending'
                ORDER BY j.priority DESC LIMIT 1)
               UNION ALL
               SELECT (SELECT j.priority FROM {job} j
                       WHERE j.topic = t.topic AND j.state = 'pending' AND j.priority < prio.p
                       ORDER BY j.priority DESC LIMIT 1), prio.n + 1
               FROM prio WHERE prio.p IS NOT NULL AND prio.n < 64
           )
           SELECT min(first.available_at)
           FROM prio CROSS JOIN LATERAL (
               SELECT j.available_at FROM {job} j
               WHERE j.topic = t.topic AND j.state = 'pending' AND j.priority = prio.p
                 AND j.available_at <= now()
               ORDER BY j.available_at LIMIT 1
           ) AS first
       ))::float8, 0) AS oldest_ready_seconds,
       (SELECT count(*) FROM (SELECT 1 FROM {job} j WHERE j.topic = t.topic AND j.state = 'scheduled'
                              LIMIT %(cap)s) AS s) AS scheduled
FROM unnest(%(topics)s::text[]) AS t(topic)

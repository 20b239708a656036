-- name: gauges_by_topic
-- SPEC O1: per topic, active-state depth (each count capped at `cap` index
-- entries) and the oldest ready age in seconds (0 when nothing is ready).
SELECT t.topic,
       (SELECT count(*) FROM (SELECT 1 FROM {job} j WHERE j.topic = t.topic AND j.state = 'pending'
                              LIMIT %(cap)s) AS s) AS pending,
       (SELECT count(*) FROM (SELECT 1 FROM {job} j WHERE j.topic = t.topic AND j.state = 'processing'
                              LIMIT %(cap)s) AS s) AS processing,
       (SELECT count(*) FROM (SELECT 1 FROM {job} j WHERE j.topic = t.topic AND j.state = 'failed'
                              LIMIT %(cap)s) AS s) AS failed,
       coalesce(extract(epoch FROM now() - (
           SELECT min(j.available_at) FROM {job} j
           WHERE j.topic = t.topic AND j.state IN ('pending', 'failed') AND j.available_at <= now()
       ))::float8, 0) AS oldest_ready_seconds
FROM unnest(%(topics)s::text[]) AS t(topic)

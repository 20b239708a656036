-- name: stats_depth
-- Per topic: active-state depth, each count capped at `cap` index entries so a
-- huge backlog costs a bounded read, and the age of the oldest ready job in
-- seconds (0 when nothing is ready; one probe of the ready-age index).
SELECT t.topic,
       (SELECT count(*) FROM (SELECT 1 FROM {job} j WHERE j.topic = t.topic AND j.state = 'pending'
                              LIMIT %(cap)s) AS s) AS pending,
       (SELECT count(*) FROM (SELECT 1 FROM {job} j WHERE j.topic = t.topic AND j.state = 'processing'
                              LIMIT %(cap)s) AS s) AS processing,
       (SELECT count(*) FROM (SELECT 1 FROM {job} j WHERE j.topic = t.topic AND j.state = 'failed'
                              LIMIT %(cap)s) AS s) AS failed,
       coalesce(extract(epoch FROM now() - (
           SELECT j.available_at FROM {job} j
           WHERE j.topic = t.topic AND j.state IN ('pending', 'failed') AND j.available_at <= now()
           ORDER BY j.available_at
           LIMIT 1
       ))::float8, 0) AS oldest_ready_seconds
FROM unnest(%(topics)s::text[]) AS t(topic)
ORDER BY t.topic

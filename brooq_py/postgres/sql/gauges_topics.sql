-- name: gauges_topics
-- SPEC O1, Z2: what the engine's refresher reads every few seconds, per topic
-- of %(topics)s: the depth of each active state and the age of the oldest
-- ready job (0 when nothing is ready). Every count stops at %(cap)s rows, so a
-- refresh never walks the table:
--   pending              the claim index (topic, priority DESC, available_at, id);
--   scheduled, failed,   job_waiting_idx (topic, state), partial on those three states;
--   blocked
--   parked               job_parked_idx (topic, id), partial on parked rows (SPEC F3);
--   processing           one pass over the processing rows (job_lease_expiry_idx),
--                        at most %(cap)s in all: they are bounded by the workers.
-- Ready means pending with available_at <= now() (SPEC S5-S6). The oldest one
-- is found on the claim index by a skip scan: one probe per distinct priority
-- of the topic's pending jobs (at most 64 of them), then the earliest
-- available_at under each.
WITH processing AS (
    SELECT p.topic, count(*) AS n
    FROM (SELECT j.topic FROM {job} j
          WHERE j.state = 'processing' AND j.topic = ANY(%(topics)s::text[])
          LIMIT %(cap)s) AS p
    GROUP BY p.topic
)
SELECT t.topic,
       (SELECT count(*) FROM (SELECT 1 FROM {job} j WHERE j.topic = t.topic AND j.state = 'pending'
                              LIMIT %(cap)s) AS s) AS pending,
       (SELECT count(*) FROM (SELECT 1 FROM {job} j WHERE j.topic = t.topic AND j.state = 'scheduled'
                              LIMIT %(cap)s) AS s) AS scheduled,
       coalesce((SELECT p.n FROM processing p WHERE p.topic = t.topic), 0) AS processing,
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
       (SELECT count(*) FROM (SELECT 1 FROM {job} j WHERE j.topic = t.topic AND j.state = 'blocked'
                              LIMIT %(cap)s) AS s) AS blocked,
       (SELECT count(*) FROM (SELECT 1 FROM {job} j WHERE j.topic = t.topic AND j.state = 'parked'
                              LIMIT %(cap)s) AS s) AS parked
FROM unnest(%(topics)s::text[]) AS t(topic)

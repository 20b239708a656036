-- name: stats_topics
-- The topics that have active jobs, for `stats`. Ready and waiting topics come
-- from skip scans of the claim index (pending rows) and of the stage index
-- (scheduled, failed and blocked rows: job_waiting_idx): one probe per distinct topic, however many jobs
-- each holds; processing rows are few (bounded by the workers running).
WITH RECURSIVE ready(topic) AS (
    (SELECT topic FROM {job} WHERE state = 'pending' ORDER BY topic LIMIT 1)
    UNION ALL
    SELECT (SELECT j.topic FROM {job} j
            WHERE j.state = 'pending' AND j.topic > r.topic
            ORDER BY j.topic LIMIT 1)
    FROM ready r
    WHERE r.topic IS NOT NULL
), waiting(topic) AS (
    (SELECT topic FROM {job} WHERE state IN ('scheduled', 'failed', 'blocked') ORDER BY topic LIMIT 1)
    UNION ALL
    SELECT (SELECT j.topic FROM {job} j
            WHERE j.state IN ('scheduled', 'failed', 'blocked') AND j.topic > w.topic
            ORDER BY j.topic LIMIT 1)
    FROM waiting w
    WHERE w.topic IS NOT NULL
), parked(topic) AS (
    -- SPEC F3: parked rows, by job_parked_idx (topic, id)
    (SELECT topic FROM {job} WHERE state = 'parked' ORDER BY topic LIMIT 1)
    UNION ALL
    SELECT (SELECT j.topic FROM {job} j WHERE j.state = 'parked' AND j.topic > p.topic ORDER BY j.topic LIMIT 1)
    FROM parked p
    WHERE p.topic IS NOT NULL
)
SELECT topic FROM ready WHERE topic IS NOT NULL
UNION
SELECT topic FROM waiting WHERE topic IS NOT NULL
UNION
SELECT topic FROM parked WHERE topic IS NOT NULL
UNION
SELECT topic FROM {job} WHERE state = 'processing'
ORDER BY topic
LIMIT %(max_topics)s

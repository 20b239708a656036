-- name: stats_topics
-- The topics that have active jobs, for `stats`. Ready/waiting topics come from a
-- skip scan of the claim index (one probe per distinct topic, however many
-- jobs each holds); processing rows are few (bounded by the workers running).
WITH RECURSIVE waiting(topic) AS (
    (SELECT topic FROM {job} WHERE state IN ('pending', 'failed') ORDER BY topic LIMIT 1)
    UNION ALL
    SELECT (SELECT j.topic FROM {job} j
            WHERE j.state IN ('pending', 'failed') AND j.topic > w.topic
            ORDER BY j.topic LIMIT 1)
    FROM waiting w
    WHERE w.topic IS NOT NULL
)
SELECT topic FROM waiting WHERE topic IS NOT NULL
UNION
SELECT topic FROM {job} WHERE state = 'processing'
ORDER BY topic
LIMIT %(max_topics)s

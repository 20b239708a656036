-- name: topic_pending_others
-- The topics with ready jobs (pending and due) that are not among %(topics)s: a loose index
-- scan of the claim index, one probe per distinct pending topic, at most 100 topics.
WITH RECURSIVE t(topic) AS (
    (SELECT topic FROM {job} WHERE state = 'pending' ORDER BY topic LIMIT 1)
    UNION ALL
    SELECT (SELECT j.topic FROM {job} j WHERE j.state = 'pending' AND j.topic > t.topic
            ORDER BY j.topic LIMIT 1)
    FROM t
    WHERE t.topic IS NOT NULL
)
SELECT topic FROM t
WHERE topic IS NOT NULL AND topic <> ALL (%(topics)s::text[])
LIMIT 100

-- name: topic_set_depth
-- SPEC F2: the topic's depth cap (NULL: none); enqueues read it through topic_caps.
-- Setting or removing a cap moves the depth sequence (migration 0014) 2^31 ahead,
-- past any cap: every Store's anchor is then too far behind to admit a job, so
-- the next capped enqueue of each counts again. Jobs written while the topic was
-- uncapped took no value, and an anchor taken before is never trusted after.
INSERT INTO {topic_setting} AS s (topic, max_depth)
SELECT %(topic)s::text, %(depth)s::int
FROM (SELECT setval(to_regclass({depth_seq}), nextval(to_regclass({depth_seq})) + 2147483648)) AS jump
ON CONFLICT (topic) DO UPDATE SET max_depth = excluded.max_depth, updated_at = now()
RETURNING topic

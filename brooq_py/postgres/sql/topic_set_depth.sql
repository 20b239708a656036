-- name: topic_set_depth
-- SPEC F2: the topic's depth cap (NULL: none); enqueues read it through topic_caps.
INSERT INTO {topic_setting} AS s (topic, max_depth)
VALUES (%(topic)s, %(depth)s)
ON CONFLICT (topic) DO UPDATE SET max_depth = excluded.max_depth, updated_at = now()
RETURNING topic

-- name: topic_caps
-- SPEC F2: the depth-capped topics and their caps (a Store caches them for a second).
SELECT topic, max_depth FROM {topic_setting} WHERE max_depth IS NOT NULL

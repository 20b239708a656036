-- name: topic_caps
-- SPEC F2: the depth-capped topics and their caps (a Store caches them for a second).
-- max_depth is read through the row's jsonb, so that on a schema not yet migrated
-- to 0010 (no such column) there are no caps, and producers deployed before the
-- migration keep enqueueing what they could before; the table holds one row per
-- touched topic.
-- The last column: whether the schema has job_sequence_halt (migration 0018), which the depth
-- count reads (depth_waiting.sql; depth_waiting_0017.sql before it).
SELECT s.topic, (to_jsonb(s) ->> 'max_depth')::int, coalesce((to_jsonb(s) ->> 'depth_park')::bool, false),
       to_regclass({halt_table}) IS NOT NULL
FROM {topic_setting} s
WHERE to_jsonb(s) ->> 'max_depth' IS NOT NULL

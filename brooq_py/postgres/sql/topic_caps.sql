-- name: topic_caps
-- SPEC F2: the depth-capped topics and their caps (a Store caches them for a second).
-- max_depth is read through the row's jsonb, so that on a schema not yet migrated
-- to 0010 (no such column) there are no caps, and producers deployed before the
-- migration keep enqueueing what they could before; the table holds one row per
-- touched topic.
-- The last two columns, on every row (and on a row of NULLs when no topic is capped): whether
-- the schema has job_sequence_halt (migration 0018), which the depth count reads
-- (depth_waiting.sql; depth_waiting_0017.sql before it), and whether this snapshot is the
-- statement's own (READ COMMITTED): one a caller's REPEATABLE READ transaction took earlier may
-- not see a cap set since, and is used for that enqueue only, never kept for the Store's others.
WITH c AS (
    SELECT to_regclass({halt_table}) IS NOT NULL AS halts,
           current_setting('transaction_isolation') = 'read committed' AS fresh
)
SELECT s.topic, (to_jsonb(s) ->> 'max_depth')::int, coalesce((to_jsonb(s) ->> 'depth_park')::bool, false),
       c.halts, c.fresh
FROM c
LEFT JOIN {topic_setting} s ON to_jsonb(s) ->> 'max_depth' IS NOT NULL

-- name: topic_room
-- SPEC F2 for a group's `then` (enqueue_group): whether %(n)s more waiting jobs of a topic
-- capped at %(cap)s fit, counted as job_enqueue counts (depth_waiting.sql), so
-- that a `then` that would not fit is refused before the group is written, not after it.
SELECT (SELECT d.waiting FROM (SELECT %(topic)s::text AS topic, %(cap)s::int AS cap) AS dt,
                              LATERAL ({depth_waiting}) AS d)
     + %(n)s <= %(cap)s

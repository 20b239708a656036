-- name: topic_forget
-- Remove a topic's settings row (pause, limits, tenant defaults): the topic runs as if never
-- touched. The NOTIFY wakes the engines that run it (a paused topic's jobs may be claimed at once).
-- A tenant topic stays one (its mark is not a setting, SPEC T1), and its tenants' own settings stay.
WITH gone AS (
    DELETE FROM {topic_setting} WHERE topic = %(topic)s RETURNING topic
)
SELECT topic, pg_notify({channel_literal}, topic) FROM gone

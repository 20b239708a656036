-- name: topic_set_park
-- SPEC F3: whether the topic's depth cap parks jobs past it instead of refusing them
-- (migration 0018), written after topic_set_depth made the topic's row.
UPDATE {topic_setting} SET depth_park = %(park)s::bool, updated_at = now()
WHERE topic = %(topic)s AND depth_park IS DISTINCT FROM %(park)s::bool
RETURNING topic

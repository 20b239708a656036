-- name: topic_pause
-- SPEC Q2: no engine claims a paused topic from its next claim on.
INSERT INTO {topic_setting} AS s (topic, paused)
VALUES (%(topic)s, true)
ON CONFLICT (topic) DO UPDATE SET paused = true, updated_at = now()
WHERE NOT s.paused

-- name: topic_resume
-- SPEC Q2: resume, and wake the engines of the topic.
WITH resumed AS (
    UPDATE {topic_setting}
    SET paused = false, updated_at = now()
    WHERE topic = %(topic)s AND paused
    RETURNING topic
)
SELECT topic, pg_notify({channel_literal}, topic) FROM resumed

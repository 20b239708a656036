-- name: topic_set_limit
-- SPEC Q3: the topic's global concurrency limit (NULL: unlimited); a raised limit wakes its engines.
WITH upsert AS (
    INSERT INTO {topic_setting} AS s (topic, concurrency_limit)
    VALUES (%(topic)s, %(limit)s)
    ON CONFLICT (topic) DO UPDATE SET concurrency_limit = excluded.concurrency_limit, updated_at = now()
    RETURNING topic
)
SELECT topic, pg_notify({channel_literal}, topic) FROM upsert

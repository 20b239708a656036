-- name: topic_settings
-- Every topic an operator has touched: paused and its global limit.
SELECT topic, paused, concurrency_limit, updated_at
FROM {topic_setting}
ORDER BY topic

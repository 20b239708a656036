-- name: topic_limit_hold
-- SPEC Q3: a topic about to be limited for the first time is first held at limit 0: from this
-- commit on, the common claim leaves it out and the limited path takes nothing of it, while the
-- claims that began before (and did not see it) commit; set_limit then writes the real limit.
-- Returns a row only when it held the topic (it had no limit yet).
INSERT INTO {topic_setting} AS s (topic, concurrency_limit)
VALUES (%(topic)s, 0)
ON CONFLICT (topic) DO UPDATE SET concurrency_limit = 0, updated_at = now()
WHERE s.concurrency_limit IS NULL
RETURNING topic

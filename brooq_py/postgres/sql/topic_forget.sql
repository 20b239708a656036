-- name: topic_forget
-- Remove a topic's settings row (pause, limits): the topic runs as if never touched. The
-- NOTIFY wakes the engines that run it (a paused topic's jobs may be claimed at once).
-- A topic whose jobs name tenants keeps its row, its settings cleared: the mark sends its
-- claims to job_claim_fair (SPEC T1), and its tenants' own settings stay.
WITH gone AS (
    DELETE FROM {topic_setting} WHERE topic = %(topic)s AND NOT EXISTS (SELECT FROM {tenant_topic} m WHERE m.topic = %(topic)s) RETURNING topic
), cleared AS (
    UPDATE {topic_setting}
    SET paused = false, concurrency_limit = NULL, rate_limit = NULL, rate_per = NULL, rate_burst = NULL,
        rate_tokens = NULL, rate_at = NULL, max_depth = NULL, tenant_limit = NULL, tenant_rate_limit = NULL,
        tenant_rate_per = NULL, tenant_rate_burst = NULL, updated_at = now()
    WHERE topic = %(topic)s AND EXISTS (SELECT FROM {tenant_topic} m WHERE m.topic = %(topic)s)
      AND (paused OR concurrency_limit IS NOT NULL OR rate_limit IS NOT NULL OR max_depth IS NOT NULL
           OR tenant_limit IS NOT NULL OR tenant_rate_limit IS NOT NULL)
    RETURNING topic
)
SELECT topic, pg_notify({channel_literal}, topic) FROM (SELECT topic FROM gone UNION ALL SELECT topic FROM cleared) AS f

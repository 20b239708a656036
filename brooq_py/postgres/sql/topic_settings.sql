-- name: topic_settings
-- Every topic an operator has touched: paused, its global limit, its rate limit
-- with the tokens left now (by the database clock, as the claim counts them)
-- and its depth cap; whether its jobs name tenants (SPEC T1: its mark in tenant_topic, with or
-- without a settings row), and if so whether nothing limits them (no limit or rate of the topic
-- or of any tenant: its claim needs no lock).
SELECT coalesce(s.topic, m.topic) AS topic, coalesce(s.paused, false), s.concurrency_limit,
       coalesce(s.updated_at, m.marked_at), s.rate_limit, s.rate_per, s.rate_burst,
       CASE WHEN s.rate_limit IS NOT NULL THEN
           least(s.rate_burst::float8,
                 coalesce(s.rate_tokens, s.rate_burst)
                 + greatest(0, extract(epoch FROM clock_timestamp() - coalesce(s.rate_at, clock_timestamp())))::float8
                   * s.rate_limit / s.rate_per)
       END AS tokens,
       s.max_depth, m.topic IS NOT NULL AS tenants,
       m.topic IS NOT NULL AND s.concurrency_limit IS NULL AND s.rate_limit IS NULL AND s.tenant_limit IS NULL
           AND s.tenant_rate_limit IS NULL
           AND NOT EXISTS (SELECT FROM {tenant_setting} t
                           WHERE t.topic = m.topic AND (t.concurrency_limit IS NOT NULL OR t.rate_limit IS NOT NULL))
           AS tenants_free
FROM {topic_setting} s
FULL JOIN {tenant_topic} m ON m.topic = s.topic
ORDER BY 1

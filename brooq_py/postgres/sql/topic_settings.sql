-- name: topic_settings
-- Every topic an operator has touched: paused, its global limit, its rate limit
-- with the tokens left now (by the database clock, as the claim counts them)
-- and its depth cap; whether its jobs name tenants (SPEC T1), and if so whether nothing limits
-- them (no limit or rate of the topic or of any tenant: its claim needs no lock).
SELECT topic, paused, concurrency_limit, updated_at, rate_limit, rate_per, rate_burst,
       CASE WHEN rate_limit IS NOT NULL THEN
           least(rate_burst::float8,
                 coalesce(rate_tokens, rate_burst)
                 + greatest(0, extract(epoch FROM clock_timestamp() - coalesce(rate_at, clock_timestamp())))::float8
                   * rate_limit / rate_per)
       END AS tokens,
       max_depth, EXISTS (SELECT FROM {tenant_topic} m WHERE m.topic = s.topic) AS tenants,
       EXISTS (SELECT FROM {tenant_topic} m WHERE m.topic = s.topic) AND concurrency_limit IS NULL AND rate_limit IS NULL AND tenant_limit IS NULL
           AND tenant_rate_limit IS NULL
           AND NOT EXISTS (SELECT FROM {tenant_setting} t
                           WHERE t.topic = s.topic AND (t.concurrency_limit IS NOT NULL OR t.rate_limit IS NOT NULL))
           AS tenants_free
FROM {topic_setting} s
ORDER BY topic

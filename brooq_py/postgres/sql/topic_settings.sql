-- name: topic_settings
-- Every topic an operator has touched: paused, its global limit, its rate limit
-- with the tokens left now (by the database clock, as the claim counts them)
-- and its depth cap; whether its jobs name tenants (SPEC T1).
SELECT topic, paused, concurrency_limit, updated_at, rate_limit, rate_per, rate_burst,
       CASE WHEN rate_limit IS NOT NULL THEN
           least(rate_burst::float8,
                 coalesce(rate_tokens, rate_burst)
                 + greatest(0, extract(epoch FROM clock_timestamp() - coalesce(rate_at, clock_timestamp())))::float8
                   * rate_limit / rate_per)
       END AS tokens,
       max_depth, tenants
FROM {topic_setting}
ORDER BY topic

-- name: topic_overview
-- Every topic with jobs, settings or a tenant mark: jobs per state, the oldest ready job's age,
-- paused, the global limit, the rate limit with its tokens left now, the depth cap
-- and the tenants waiting (the `topics` command). One grouped scan of the table.
WITH counts AS (
    SELECT topic, jsonb_object_agg(state, n) AS counts
    FROM (SELECT topic, state, count(*) AS n FROM {job} GROUP BY topic, state) AS c
    GROUP BY topic
), ready AS (
    SELECT topic, extract(epoch FROM now() - min(available_at))::float8 AS age
    FROM {job}
    WHERE state = 'pending' AND available_at <= now()
    GROUP BY topic
), tenants AS (
    -- SPEC T1: the tenants with jobs waiting, in the topics whose jobs name one (none: the tenant of no name)
    SELECT j.topic, count(DISTINCT coalesce(j.tenant, '')) AS n
    FROM {job} j
    JOIN {tenant_topic} m ON m.topic = j.topic
    WHERE j.state = 'pending'
    GROUP BY j.topic
), named AS (
    SELECT topic FROM counts UNION SELECT topic FROM {topic_setting} UNION SELECT topic FROM {tenant_topic}
)
SELECT n.topic,
       coalesce(c.counts, '{{}}'::jsonb),
       coalesce(r.age, 0),
       coalesce(s.paused, false),
       s.concurrency_limit,
       s.rate_limit, s.rate_per, s.rate_burst,
       CASE WHEN s.rate_limit IS NOT NULL THEN
           least(s.rate_burst::float8,
                 coalesce(s.rate_tokens, s.rate_burst)
                 + greatest(0, extract(epoch FROM clock_timestamp() - coalesce(s.rate_at, clock_timestamp())))::float8
                   * s.rate_limit / s.rate_per)
       END AS tokens,
       s.max_depth,
       t.n AS tenants_waiting
FROM named n
LEFT JOIN counts c ON c.topic = n.topic
LEFT JOIN {topic_setting} s ON s.topic = n.topic
LEFT JOIN ready r ON r.topic = n.topic
LEFT JOIN tenants t ON t.topic = n.topic
ORDER BY 1

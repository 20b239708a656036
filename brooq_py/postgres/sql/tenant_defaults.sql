-- name: tenant_defaults
-- SPEC T1-T3: a topic's tenant settings for the dashboard's tenants page: whether its jobs name
-- tenants, the default limit and rate of every tenant, and the jobs of the tenant of no name
-- (jobs without a tenant, one more tenant of such a topic): its waiting count is the topic's
-- pending jobs less those with a tenant, each count reading at most %(cap)s index entries (exact
-- while the first is under the cap), and its running jobs. No row: the topic has no settings and no mark.
SELECT m.topic IS NOT NULL AS tenants, s.tenant_limit, s.tenant_rate_limit, s.tenant_rate_per, s.tenant_rate_burst,
       CASE WHEN m.topic IS NOT NULL THEN
           (SELECT count(*) FROM (SELECT FROM {job} j WHERE j.topic = m.topic AND j.state = 'pending'
                                  LIMIT %(cap)s) AS a)
       END AS pending,
       CASE WHEN m.topic IS NOT NULL THEN
           (SELECT count(*) FROM (SELECT FROM {job} j WHERE j.topic = m.topic AND j.state = 'pending'
                                  AND j.turn IS NOT NULL LIMIT %(cap)s) AS n)
       END AS pending_named,
       CASE WHEN m.topic IS NOT NULL THEN
           (SELECT count(*) FROM {job} j WHERE j.topic = m.topic AND j.state = 'processing' AND j.turn IS NULL)
       END AS running_unnamed
FROM (SELECT %(topic)s::text AS topic) AS t
LEFT JOIN {topic_setting} s ON s.topic = t.topic
LEFT JOIN {tenant_topic} m ON m.topic = t.topic
WHERE s.topic IS NOT NULL OR m.topic IS NOT NULL

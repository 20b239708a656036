-- name: tenant_list
-- SPEC T1-T3: a topic's tenants as an operator sees them: each tenant with jobs waiting or
-- running (at most %(limit)s of them, read through the tenant index: bounded whatever the backlog
-- is, GAUGE_CAP entries a count) and each one with settings of its own; '' stands for the tenant
-- of no name. Columns: tenant, waiting, running, own limit, own rate, per, burst, weight.
WITH named AS (
    SELECT DISTINCT j.tenant FROM (
        SELECT tenant FROM {job}
        WHERE topic = %(topic)s AND turn IS NOT NULL AND state IN ('pending', 'processing', 'scheduled')
        LIMIT %(cap)s
    ) AS j
    UNION
    SELECT t.tenant FROM {tenant_setting} t
    WHERE t.topic = %(topic)s AND t.tenant <> ''
      AND (t.weight IS NOT NULL OR t.concurrency_limit IS NOT NULL OR t.rate_limit IS NOT NULL)
)
SELECT n.tenant,
       (SELECT count(*) FROM (SELECT FROM {job} j WHERE j.topic = %(topic)s AND j.tenant = n.tenant
                              AND j.state = 'pending' AND j.turn IS NOT NULL LIMIT %(cap)s) AS w) AS waiting,
       (SELECT count(*) FROM {job} j WHERE j.topic = %(topic)s AND j.tenant = n.tenant
                              AND j.state = 'processing' AND j.turn IS NOT NULL) AS running,
       t.concurrency_limit, t.rate_limit, t.rate_per, t.rate_burst, t.weight
FROM named n
LEFT JOIN {tenant_setting} t ON t.topic = %(topic)s AND t.tenant = n.tenant
ORDER BY n.tenant
LIMIT %(limit)s

-- name: tenant_busiest
-- SPEC T1-T3, the dashboard's tenants page: a topic's named tenants, the busiest first (jobs
-- waiting plus running), at most %(limit)s of them. The tenants with jobs are found by a skip scan
-- of the tenant index (one probe a tenant, whatever the backlog), at most %(seen)s of them, in
-- name order; those with settings of their own join them. Each waiting count reads at most
-- %(cap)s index entries. Columns: tenant, waiting, running, own limit, own rate, per, burst,
-- weight, the number of tenants listed before the limit, and how many tenants the scan found.
WITH RECURSIVE active(tenant) AS (
    (SELECT j.tenant FROM {job} j
     WHERE j.topic = %(topic)s AND j.turn IS NOT NULL AND j.state IN ('pending', 'processing', 'scheduled')
     ORDER BY j.tenant LIMIT 1)
    UNION ALL
    SELECT (SELECT j.tenant FROM {job} j
            WHERE j.topic = %(topic)s AND j.turn IS NOT NULL
              AND j.state IN ('pending', 'processing', 'scheduled') AND j.tenant > a.tenant
            ORDER BY j.tenant LIMIT 1)
    FROM active a
    WHERE a.tenant IS NOT NULL
), seen AS (
    SELECT tenant FROM active WHERE tenant IS NOT NULL LIMIT %(seen)s
), named AS (
    SELECT tenant FROM seen
    UNION
    SELECT t.tenant FROM {tenant_setting} t
    WHERE t.topic = %(topic)s AND t.tenant <> ''
      AND (t.weight IS NOT NULL OR t.concurrency_limit IS NOT NULL OR t.rate_limit IS NOT NULL)
), counted AS MATERIALIZED (  -- each count once, though the order reads them again
    SELECT n.tenant,
           (SELECT count(*) FROM (SELECT FROM {job} j WHERE j.topic = %(topic)s AND j.tenant = n.tenant
                                  AND j.state = 'pending' AND j.turn IS NOT NULL LIMIT %(cap)s) AS w) AS waiting,
           (SELECT count(*) FROM {job} j WHERE j.topic = %(topic)s AND j.tenant = n.tenant
                                  AND j.state = 'processing' AND j.turn IS NOT NULL) AS running
    FROM named n
)
SELECT c.tenant, c.waiting, c.running,
       t.concurrency_limit, t.rate_limit, t.rate_per, t.rate_burst, t.weight,
       count(*) OVER () AS listed,
       (SELECT count(*) FROM seen) AS scanned
FROM counted c
LEFT JOIN {tenant_setting} t ON t.topic = %(topic)s AND t.tenant = c.tenant
ORDER BY c.waiting + c.running DESC, c.tenant
LIMIT %(limit)s

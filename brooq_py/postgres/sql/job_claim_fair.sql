-- name: job_claim_fair
-- SPEC T1-T3: claim a topic whose jobs name tenants, after topic_claim_lock in the same
-- transaction (as job_claim_limited: this statement's snapshot sees every claim committed
-- before, so the counts below are exact across engines). The order is the fair index's:
-- priority, then turn (each job's place in its tenant's round-robin, given at its insert by
-- migration 0019's trigger), so the claim reads the first %(window)s entries whatever the number
-- of tenants. Jobs of the topic without a tenant are one more tenant: the first %(window)s
-- of them in the claim order, read from their own index (job_unnamed_idx, migration 0021) whatever
-- the named backlog ahead of them, taken at the front's turn, one a turn.
-- Of those candidates a tenant gives at most its limit less its processing jobs and at
-- most floor(tokens) of its bucket (its own setting, else the topic's tenant defaults; a bucket
-- is read only for the tenants among the candidates, and written only for those that took a
-- job). The topic's own pause, global limit and rate limit hold as in job_claim_limited; the
-- last column is the seconds until the topic's next token, as there.
-- The window's entries are locked as the scans meet them, those held elsewhere (an operator's
-- SELECT ... FOR UPDATE over the head of the order) skipped, so the window lies past them: under
-- the topic's lock no other claim of the topic waits on the entries read and not taken.
-- A topic that nothing limits is claimed without the lock by job_claim_fair_free first. A limit set
-- meanwhile waits for the writers begun before it (Flow.set_tenant_limit), so no claim under the
-- lock counts beside a free claim it cannot see.
WITH clock AS (
    SELECT clock_timestamp() AS t
), setting AS (
    SELECT m.topic, s.concurrency_limit, s.rate_limit, s.rate_per, s.tenant_limit,
           s.tenant_rate_limit, s.tenant_rate_per, s.tenant_rate_burst,
           {topic_tokens} AS tokens
    FROM {tenant_topic} m LEFT JOIN {topic_setting} s ON s.topic = m.topic, clock c
    WHERE m.topic = %(topic)s AND NOT coalesce(s.paused, false)
      AND NOT EXISTS (SELECT FROM {engine} e
                      WHERE e.id = %(worker)s AND e.seen_at + e.lease - e.margin <= now())
), {claim_room}, turned AS (
    SELECT j.id, j.tenant, j.priority, j.turn
    FROM {live} j
    WHERE j.topic = %(topic)s AND j.state = 'pending' AND j.turn IS NOT NULL AND j.available_at <= now()
      AND coalesce((SELECT n FROM room), 0) > 0
    ORDER BY j.priority DESC, j.turn, j.id
    LIMIT %(window)s
    FOR NO KEY UPDATE OF j SKIP LOCKED
), unnamed AS (
    SELECT w.id, NULL::text AS tenant, w.priority,
           coalesce((SELECT min(t.turn) FROM turned t WHERE t.priority = w.priority), 0)
             + row_number() OVER (PARTITION BY w.priority ORDER BY w.available_at, w.id) - 1 AS turn
    FROM (
        SELECT j.id, j.priority, j.available_at
        FROM {live} j
        WHERE j.topic = %(topic)s AND j.state = 'pending' AND j.turn IS NULL AND j.available_at <= now()
          AND coalesce((SELECT n FROM room), 0) > 0
        ORDER BY j.priority DESC, j.available_at, j.id
        LIMIT %(window)s
        FOR NO KEY UPDATE OF j SKIP LOCKED
    ) AS w
), cand AS (
    SELECT c.*, row_number() OVER (PARTITION BY c.tenant ORDER BY c.priority DESC, c.turn, c.id) AS k
    FROM (SELECT * FROM turned UNION ALL SELECT * FROM unnamed) AS c
), tenants AS (
    SELECT d.tenant,
           coalesce(ts.concurrency_limit, s.tenant_limit) AS lim,
           coalesce(ts.rate_limit, s.tenant_rate_limit) AS rate,
           CASE WHEN ts.rate_limit IS NOT NULL THEN ts.rate_per ELSE s.tenant_rate_per END AS per,
           CASE WHEN ts.rate_limit IS NOT NULL THEN ts.rate_burst ELSE s.tenant_rate_burst END AS burst,
           ts.rate_tokens, ts.rate_at
    FROM (SELECT DISTINCT tenant FROM cand) AS d
    CROSS JOIN setting s
    LEFT JOIN {tenant_setting} ts ON ts.topic = %(topic)s AND ts.tenant = coalesce(d.tenant, '')
), counted AS (
    SELECT t.*,
           CASE WHEN t.lim IS NULL THEN NULL
                WHEN t.tenant IS NULL THEN (
                    SELECT count(*) FROM {live} p
                    WHERE p.topic = %(topic)s AND p.state = 'processing' AND p.tenant IS NULL)
                ELSE (
                    SELECT count(*) FROM {live} p
                    WHERE p.topic = %(topic)s AND p.tenant = t.tenant AND p.state = 'processing'
                      AND p.turn IS NOT NULL)
           END AS running,
           CASE WHEN t.rate IS NOT NULL THEN
               least(t.burst::float8,
                     coalesce(t.rate_tokens, t.burst)
                     + greatest(0, extract(epoch FROM c.t - coalesce(t.rate_at, c.t)))::float8 * t.rate / t.per)
           END AS tokens
    FROM tenants t, clock c
), picked AS (
    SELECT c.id, c.priority, c.turn
    FROM cand c
    JOIN counted t ON t.tenant IS NOT DISTINCT FROM c.tenant
    WHERE (t.lim IS NULL OR c.k <= t.lim - t.running)
      AND (t.rate IS NULL OR c.k <= floor(t.tokens))
), ordered AS (
    -- The eligible candidates' ids in the fair order, one array: the lock below and the update find
    -- them by primary key whatever the generic plan's guess of the window (a hash of the job table).
    SELECT ARRAY(SELECT p.id FROM picked p ORDER BY p.priority DESC, p.turn, p.id) AS ids
), locked AS (
    -- The room's worth of the eligible candidates, in the fair order, locked as they are taken: one
    -- locked elsewhere (an operator's SELECT ... FOR UPDATE) is skipped, never waited on, and the
    -- next one taken in its place (the limit is applied above the row locks, as in job_claim_limited),
    -- so a held row never stops its topic. A tenant's candidates keep the numbers k given before
    -- the skip: a skipped row can only leave its tenant under its limit or bucket, never over.
    SELECT j.id FROM {live} j
    WHERE j.id = ANY ((SELECT ids FROM ordered)::uuid[]) AND j.state = 'pending'
    ORDER BY array_position((SELECT ids FROM ordered), j.id)
    LIMIT coalesce((SELECT n FROM room), 0)
    FOR NO KEY UPDATE OF j SKIP LOCKED
), claimed AS (
    UPDATE {live} j
    SET updated_at = (SELECT t FROM clock),
        {claim_set}
    WHERE j.id = ANY (ARRAY(SELECT id FROM locked))
    RETURNING j.id, j.topic, j.payload, j.attempts, j.priority, j.claim_token, j.locked_by,
              j.locked_until, j.available_at, j.meta, j.crashes, j.tenant, j.turn
), spent AS (
    UPDATE {topic_setting} t
    SET rate_tokens = s.tokens - (SELECT count(*) FROM claimed),
        rate_at = greatest(t.rate_at, c.t)
    FROM setting s, clock c
    WHERE t.topic = s.topic AND s.rate_limit IS NOT NULL AND EXISTS (SELECT FROM claimed)
    RETURNING t.topic
), spent_tenants AS (
    INSERT INTO {tenant_setting} AS ts (topic, tenant, rate_tokens, rate_at)
    SELECT %(topic)s, coalesce(t.tenant, ''), t.tokens - g.n, c.t
    FROM counted t
    JOIN (SELECT tenant, count(*) AS n FROM claimed GROUP BY tenant) AS g
        ON g.tenant IS NOT DISTINCT FROM t.tenant
    CROSS JOIN clock c
    WHERE t.rate IS NOT NULL
    ON CONFLICT (topic, tenant) DO UPDATE
    SET rate_tokens = excluded.rate_tokens, rate_at = greatest(ts.rate_at, excluded.rate_at)
    RETURNING ts.tenant
), left_after AS (
    SELECT s.rate_limit, s.rate_per, s.tokens - (SELECT count(*) FROM claimed) AS tokens
    FROM setting s
)
SELECT c.id::text, c.topic, c.payload::text, c.attempts, c.priority, c.claim_token::text, c.locked_by,
       c.locked_until, c.meta::text, c.crashes,
       CASE WHEN l.rate_limit IS NOT NULL AND l.tokens < 1
            THEN (1 - l.tokens) * l.rate_per / l.rate_limit END AS next_token_in,
       (SELECT n FROM room) AS room  -- fewer taken: no more ready, or only tenants at their limit
FROM left_after l
LEFT JOIN claimed c ON true
ORDER BY c.priority DESC, c.turn, c.id

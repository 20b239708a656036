-- name: job_claim_fair_free
-- SPEC T1: job_claim_fair for a tenant topic that nothing limits, alone on the claimer's connection
-- (one round trip, no lock): no count and no bucket to read, so only the fair order is left. The
-- first %(window)s ready entries of job_fair_idx in (priority, turn) order, and the first %(window)s
-- jobs without a tenant (job_unnamed_idx) at the front's turn, one a turn, as in job_claim_fair;
-- of those, the first %(limit)s that no other claim holds, locked as they are taken and only
-- those: a job read but not taken is not left locked, so a claim beside this one (another
-- engine's) never passes over it to take one behind it of the same tenant (FIFO within a tenant).
-- A window whose every entry is held elsewhere is looked past (past_window).
-- No row at all when this statement's snapshot sees a limit after all (or the engine is stale):
-- the claim is made again by job_claim_fair under the topic's lock. A row of NULLs: nothing taken.
WITH setting AS (
    SELECT m.topic
    FROM {tenant_topic} m LEFT JOIN {topic_setting} s ON s.topic = m.topic
    WHERE m.topic = %(topic)s AND NOT coalesce(s.paused, false)
      AND s.concurrency_limit IS NULL AND s.rate_limit IS NULL AND s.tenant_limit IS NULL
      AND s.tenant_rate_limit IS NULL
      AND NOT EXISTS (SELECT FROM {tenant_setting} t
                      WHERE t.topic = m.topic AND (t.concurrency_limit IS NOT NULL OR t.rate_limit IS NOT NULL))
      AND NOT EXISTS (SELECT FROM {engine} e
                      WHERE e.id = %(worker)s AND e.seen_at + e.lease - e.margin <= now())
), turned AS (
    SELECT j.id, j.priority, j.turn
    FROM {live} j
    WHERE j.topic = %(topic)s AND j.state = 'pending' AND j.turn IS NOT NULL AND j.available_at <= now()
      AND EXISTS (SELECT FROM setting)
    ORDER BY j.priority DESC, j.turn, j.id
    LIMIT %(window)s
), unnamed AS (
    SELECT w.id, w.priority,
           coalesce((SELECT min(t.turn) FROM turned t WHERE t.priority = w.priority), 0)
             + row_number() OVER (PARTITION BY w.priority ORDER BY w.available_at, w.id) - 1 AS turn
    FROM (
        SELECT j.id, j.priority, j.available_at
        FROM {live} j
        WHERE j.topic = %(topic)s AND j.state = 'pending' AND j.turn IS NULL AND j.available_at <= now()
          AND EXISTS (SELECT FROM setting)
        ORDER BY j.priority DESC, j.available_at, j.id
        LIMIT %(window)s
    ) AS w
), cand AS (
    -- The candidates' ids in the fair order, one array: the lock below and the update find them by
    -- primary key whatever the plan's guess of the window (a generic plan guesses a join too large).
    SELECT ARRAY(SELECT c.id
                 FROM (SELECT id, priority, turn FROM turned
                       UNION ALL SELECT id, priority, turn FROM unnamed) AS c
                 ORDER BY c.priority DESC, c.turn, c.id) AS ids
), locked AS (
    -- As job_claim_fair's: the first %(limit)s candidates in the fair order that are still pending,
    -- each locked as it is taken; one locked elsewhere (another claim in flight, an operator's
    -- SELECT ... FOR UPDATE) is skipped, never waited on, and the next one taken in its place.
    SELECT j.id FROM {live} j
    WHERE j.id = ANY ((SELECT ids FROM cand)::uuid[]) AND j.state = 'pending'
    ORDER BY array_position((SELECT ids FROM cand), j.id)
    LIMIT %(limit)s
    FOR NO KEY UPDATE OF j SKIP LOCKED
), got AS (
    SELECT count(*) AS n FROM locked
), past_window AS (
    -- Fewer than %(limit)s taken although the window was full: every entry of it is held elsewhere (an
    -- operator's SELECT ... FOR UPDATE over the head of the order). Look past it as the topic's
    -- common claim would, the entries locked as the scans meet them; only here can an entry be
    -- locked and not taken (the first of the jobs without a tenant beside the first named ones).
    SELECT EXISTS (SELECT FROM setting) AND (SELECT n FROM got) < %(limit)s
           AND ((SELECT count(*) FROM turned) >= %(window)s OR (SELECT count(*) FROM unnamed) >= %(window)s) AS go
), turned_past AS (
    SELECT j.id, j.priority, j.turn
    FROM {live} j
    WHERE j.topic = %(topic)s AND j.state = 'pending' AND j.turn IS NOT NULL AND j.available_at <= now()
      AND (SELECT go FROM past_window) AND j.id <> ALL ((SELECT ids FROM cand)::uuid[])
    ORDER BY j.priority DESC, j.turn, j.id
    LIMIT %(limit)s
    FOR NO KEY UPDATE OF j SKIP LOCKED
), unnamed_past AS (
    SELECT w.id, w.priority,
           coalesce((SELECT min(t.turn) FROM turned_past t WHERE t.priority = w.priority), 0)
             + row_number() OVER (PARTITION BY w.priority ORDER BY w.available_at, w.id) - 1 AS turn
    FROM (
        SELECT j.id, j.priority, j.available_at
        FROM {live} j
        WHERE j.topic = %(topic)s AND j.state = 'pending' AND j.turn IS NULL AND j.available_at <= now()
          AND (SELECT go FROM past_window) AND j.id <> ALL ((SELECT ids FROM cand)::uuid[])
        ORDER BY j.priority DESC, j.available_at, j.id
        LIMIT %(limit)s
        FOR NO KEY UPDATE OF j SKIP LOCKED
    ) AS w
), past AS (
    SELECT c.id
    FROM (SELECT id, priority, turn FROM turned_past UNION ALL SELECT id, priority, turn FROM unnamed_past) AS c
    ORDER BY c.priority DESC, c.turn, c.id
    LIMIT %(limit)s - (SELECT n FROM got)
), claimed AS (
    UPDATE {live} j
    SET updated_at = clock_timestamp(),
        {claim_set}
    WHERE j.id = ANY (ARRAY(SELECT id FROM locked UNION ALL SELECT id FROM past))
    RETURNING j.id, j.topic, j.payload, j.attempts, j.priority, j.claim_token, j.locked_by,
              j.locked_until, j.meta, j.crashes, j.turn
)
SELECT c.id::text, c.topic, c.payload::text, c.attempts, c.priority, c.claim_token::text, c.locked_by,
       c.locked_until, c.meta::text, c.crashes, NULL::float8 AS next_token_in, %(limit)s::int AS room
FROM setting s
LEFT JOIN claimed c ON true
ORDER BY c.priority DESC, c.turn, c.id

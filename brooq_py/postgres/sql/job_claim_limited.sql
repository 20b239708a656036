-- name: job_claim_limited
-- SPEC Q3, F1: claim a globally limited or rate-limited topic, after
-- topic_claim_lock in the same transaction: this statement's snapshot is taken
-- once the lock is ours, so it sees every claim committed before. A
-- concurrency limit counts the topic's processing rows (the lease index holds
-- processing rows only). A rate limit is a token bucket in the topic's setting
-- row: refilled from the database clock (rate_limit tokens per rate_per
-- seconds since rate_at, at most rate_burst), the claim takes at most
-- floor(tokens) rows and spends one per row it took, in this statement. Its
-- last column (on every row, and on a row of NULLs when nothing was taken)
-- is the seconds until the next token when fewer than one is left, else NULL;
-- then the room the claim had (fewer rows taken: the topic had no more ready).
-- A paused or no longer limited topic takes nothing here (and returns no row), and so does a topic
-- whose jobs name tenants (T2, T3: its tenants' limits and order are job_claim_fair's; the Store
-- that sent this one had not seen the mark yet, and makes its claim again there).
-- F0, P1'': nothing is taken by an engine whose proof of life is older than lease - margin
-- (see job_claim.sql).
WITH clock AS (
    SELECT clock_timestamp() AS t
), setting AS (
    SELECT s.topic, s.concurrency_limit, s.rate_limit, s.rate_per,
           {topic_tokens} AS tokens
    FROM {topic_setting} s, clock c
    WHERE s.topic = %(topic)s AND NOT s.paused AND NOT EXISTS (SELECT FROM {tenant_topic} m WHERE m.topic = s.topic)
      AND (s.concurrency_limit IS NOT NULL OR s.rate_limit IS NOT NULL)
), {claim_room}, cand AS (
    SELECT id
    FROM {live}
    WHERE topic = %(topic)s AND state = 'pending' AND available_at <= now()
        AND NOT EXISTS (SELECT FROM {engine} e
                        WHERE e.id = %(worker)s AND e.seen_at + e.lease - e.margin <= now())
    ORDER BY priority DESC, available_at, id
    LIMIT coalesce((SELECT n FROM room), 0)
    FOR NO KEY UPDATE SKIP LOCKED
), claimed AS (
    UPDATE {live} j
    SET updated_at = (SELECT t FROM clock),  -- the time the bucket counted this claim at
        {claim_set}
    FROM cand
    WHERE j.id = cand.id
    RETURNING j.id, j.topic, j.payload, j.attempts, j.priority, j.claim_token, j.locked_by,
              j.locked_until, j.available_at, j.meta, j.crashes
), spent AS (
    -- Nothing taken changes nothing: the bucket refills from rate_at as it would have.
    UPDATE {topic_setting} t
    SET rate_tokens = s.tokens - (SELECT count(*) FROM claimed),
        rate_at = greatest(t.rate_at, c.t)
    FROM setting s, clock c
    WHERE t.topic = s.topic AND s.rate_limit IS NOT NULL AND EXISTS (SELECT FROM claimed)
    RETURNING t.topic
), left_after AS (
    SELECT s.rate_limit, s.rate_per, s.tokens - (SELECT count(*) FROM claimed) AS tokens
    FROM setting s
)
SELECT c.id::text, c.topic, c.payload::text, c.attempts, c.priority, c.claim_token::text, c.locked_by,
       c.locked_until, c.meta::text, c.crashes,
       CASE WHEN l.rate_limit IS NOT NULL AND l.tokens < 1
            THEN (1 - l.tokens) * l.rate_per / l.rate_limit END AS next_token_in,
       (SELECT n FROM room) AS room
FROM left_after l
LEFT JOIN claimed c ON true
ORDER BY c.priority DESC, c.available_at, c.id

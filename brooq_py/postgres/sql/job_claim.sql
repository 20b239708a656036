-- name: job_claim
-- SPEC C1. One index scan per topic (the claim index, read in claim order and
-- stopped at the limit), so a topic with nothing ready costs one probe however
-- many jobs of other topics wait; then the best `limit` candidates overall.
-- The lease comes from the database clock. Paused and globally limited topics
-- and rate-limited topics are left out in this statement's own snapshot (SPEC Q2, Q3, F1), before their
-- index is read: the limited ones are claimed by job_claim_limited under their
-- topic's lock. The settings are read once per statement (an InitPlan).
-- F0, P1'': an engine whose proof of life in its row is older than lease - margin on the
-- database clock claims nothing (it stalled after its own fence said it may claim): rows it took
-- then would be the reaper's at once, run elsewhere while it starts them. No row (run_once, an
-- older engine) claims under the row's own locked_until. One primary-key probe (an InitPlan).
WITH cand AS (
    SELECT c.id, c.priority, c.available_at
    FROM unnest(%(topics)s::text[]) AS t(topic)
    CROSS JOIN LATERAL (
        SELECT id, priority, available_at
        FROM {job}
        WHERE topic = t.topic AND state = 'pending' AND available_at <= now()
        ORDER BY priority DESC, available_at, id
        LIMIT %(limit)s
        FOR NO KEY UPDATE SKIP LOCKED
    ) AS c
    WHERE t.topic <> ALL (coalesce(
        (SELECT array_agg(s.topic) FROM {topic_setting} s WHERE s.paused OR s.concurrency_limit IS NOT NULL OR s.rate_limit IS NOT NULL),
        '{{}}'
    ))
    AND NOT EXISTS (SELECT FROM {engine} e
                    WHERE e.id = %(worker)s AND e.seen_at + e.lease - e.margin <= now())
    ORDER BY c.priority DESC, c.available_at, c.id
    LIMIT %(limit)s
), claimed AS (
    UPDATE {job} j
    SET state = 'processing',
        locked_by = %(worker)s,
        locked_until = now() + %(lease)s::interval,
        attempts = j.attempts + 1,
        claim_token = gen_random_uuid(),
        updated_at = now()
    WHERE j.id = ANY (ARRAY(SELECT id FROM cand))
    RETURNING j.id, j.topic, j.payload, j.attempts, j.priority, j.claim_token, j.locked_by,
              j.locked_until, j.available_at, j.meta, j.crashes
)
SELECT id::text, topic, payload, attempts, priority, claim_token::text, locked_by, locked_until, meta, crashes
FROM claimed
ORDER BY priority DESC, available_at, id

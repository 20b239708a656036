-- name: job_claim_limited
-- SPEC Q3: claim a globally limited topic, after topic_claim_lock in the same
-- transaction: this statement's snapshot is taken once the lock is ours, so it
-- sees every claim committed before and counts the topic's processing rows
-- (the lease index holds processing rows only) against its limit. A paused
-- or no longer limited topic takes nothing here.
WITH room AS (
    SELECT greatest(0, least(
        %(limit)s,
        s.concurrency_limit - (
            SELECT count(*) FROM {job} p WHERE p.state = 'processing' AND p.topic = s.topic
        )
    )) AS n
    FROM {topic_setting} s
    WHERE s.topic = %(topic)s AND NOT s.paused AND s.concurrency_limit IS NOT NULL
), cand AS (
    SELECT id
    FROM {job}
    WHERE topic = %(topic)s AND state = 'pending' AND available_at <= now()
    ORDER BY priority DESC, available_at, id
    LIMIT coalesce((SELECT n FROM room), 0)
    FOR NO KEY UPDATE SKIP LOCKED
), claimed AS (
    UPDATE {job} j
    SET state = 'processing',
        locked_by = %(worker)s,
        locked_until = now() + %(lease)s::interval,
        attempts = j.attempts + 1,
        claim_token = gen_random_uuid(),
        updated_at = now()
    FROM cand
    WHERE j.id = cand.id
    RETURNING j.id, j.topic, j.payload, j.attempts, j.priority, j.claim_token, j.locked_by,
              j.locked_until, j.available_at
)
SELECT id::text, topic, payload, attempts, priority, claim_token::text, locked_by, locked_until
FROM claimed
ORDER BY priority DESC, available_at, id

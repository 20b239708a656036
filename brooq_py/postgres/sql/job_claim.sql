-- name: job_claim
-- SPEC C1, B1. Per topic, the claim index in claim order, stopped at the limit; then the best
-- `limit` candidates overall. A topic sent with a head (its usual priority, and the claim key's
-- time the Store's claims reached less a slack; no time: the database's now() less the slack) is
-- read past it at that priority: while a held transaction horizon keeps vacuum from removing
-- them, the dead entries of every job claimed before would otherwise be walked by every claim.
-- Higher priorities are read from their start, lower ones only when that one had too few; a
-- topic sent without a priority is read whole (postgres/worker/heads.py).
-- Paused, globally limited and rate-limited topics are left out in this statement's snapshot (SPEC
-- Q2, Q3, F1; job_claim_limited claims them), and so are topics whose jobs name tenants (T1:
-- job_claim_fair; a job that names one marks its topic in tenant_topic, in its own transaction). An engine whose proof of life is older than lease -
-- margin on the database clock claims nothing (F0, P1''); no engine row (run_once) claims under
-- the row's own locked_until.
-- `unrecorded`: the job has no step record (DS1), read in this statement's snapshot, so true only
-- when the row version locked is the one that snapshot holds (no claim came in between). Its
-- ORDER BY keeps the probe on job_step's primary key even while the table is small (a cached
-- plan would otherwise keep a scan of the whole table once it grew).
WITH topics AS MATERIALIZED (
    SELECT t.topic, t.priority, t.after
    FROM unnest(%(topics)s::text[], %(priority)s::smallint[], %(after)s::timestamptz[]) AS t(topic, priority, after)
    WHERE t.topic <> ALL (coalesce(
        (SELECT array_agg(s.topic) FROM {topic_setting} s WHERE s.paused OR s.concurrency_limit IS NOT NULL OR s.rate_limit IS NOT NULL
                                                    ),
        '{{}}'
    ))
    AND NOT EXISTS (SELECT FROM {tenant_topic} m WHERE m.topic = t.topic)
    AND NOT EXISTS (SELECT FROM {engine} e
                    WHERE e.id = %(worker)s AND e.seen_at + e.lease - e.margin <= now())
), whole AS (
    SELECT c.id, c.priority, c.available_at, c.seen
    FROM topics t
    CROSS JOIN LATERAL (
        SELECT id, priority, available_at, ctid AS seen
        FROM {live}
        WHERE t.priority IS NULL AND topic = t.topic AND state = 'pending' AND available_at <= now()
        ORDER BY priority DESC, available_at, id
        LIMIT %(limit)s
        FOR NO KEY UPDATE SKIP LOCKED
    ) AS c
), higher AS (
    SELECT c.id, c.priority, c.available_at, c.seen, t.topic
    FROM topics t
    CROSS JOIN LATERAL (
        SELECT id, priority, available_at, ctid AS seen
        FROM {live}
        WHERE t.priority IS NOT NULL AND topic = t.topic AND state = 'pending' AND priority > t.priority
            AND available_at <= now()
        ORDER BY priority DESC, available_at, id
        LIMIT %(limit)s
        FOR NO KEY UPDATE SKIP LOCKED
    ) AS c
), level AS (
    SELECT c.id, c.priority, c.available_at, c.seen, t.topic
    FROM topics t
    CROSS JOIN LATERAL (
        SELECT id, priority, available_at, ctid AS seen
        FROM {live}
        WHERE t.priority IS NOT NULL AND topic = t.topic AND state = 'pending' AND priority = t.priority
            AND available_at > coalesce(t.after, now() - %(slack)s::interval) AND available_at <= now()
        ORDER BY available_at, id
        LIMIT %(limit)s
        FOR NO KEY UPDATE SKIP LOCKED
    ) AS c
), lower AS (
    SELECT c.id, c.priority, c.available_at, c.seen
    FROM topics t
    CROSS JOIN LATERAL (
        SELECT id, priority, available_at, ctid AS seen
        FROM {live}
        WHERE t.priority IS NOT NULL AND topic = t.topic AND state = 'pending' AND priority < t.priority
            AND available_at <= now()
            AND (SELECT count(*) FROM higher h WHERE h.topic = t.topic)
                + (SELECT count(*) FROM level l WHERE l.topic = t.topic) < %(limit)s
        ORDER BY priority DESC, available_at, id
        LIMIT %(limit)s
        FOR NO KEY UPDATE SKIP LOCKED
    ) AS c
), cand AS (
    SELECT id, priority, available_at, seen FROM whole
    UNION ALL SELECT id, priority, available_at, seen FROM higher
    UNION ALL SELECT id, priority, available_at, seen FROM level
    UNION ALL SELECT id, priority, available_at, seen FROM lower
    ORDER BY priority DESC, available_at, id
    LIMIT %(limit)s
), claimed AS (
    UPDATE {live} j
    SET updated_at = now(),
        {claim_set}
    WHERE j.id = ANY (ARRAY(SELECT id FROM cand))
    RETURNING j.id, j.topic, j.payload, j.attempts, j.priority, j.claim_token, j.locked_by,
              j.locked_until, j.available_at, j.meta, j.crashes
)
SELECT c.id::text, c.topic, c.payload::text, c.attempts, c.priority, c.claim_token::text, c.locked_by,
       c.locked_until, c.meta::text, c.crashes, c.available_at,
       k.seen = (SELECT o.ctid FROM {live} o WHERE o.id = c.id)
           AND (SELECT s.seq FROM {job_step} s WHERE s.job_id = c.id ORDER BY s.seq LIMIT 1) IS NULL AS unrecorded
FROM claimed c
JOIN cand k ON k.id = c.id
ORDER BY c.priority DESC, c.available_at, c.id

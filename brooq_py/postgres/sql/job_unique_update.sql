-- name: job_unique_update
-- SPEC U2: merge or replace (%(mode)s, as in job_enqueue_unique_update) the
-- active holder of (topic, unique_key) while it is not processing, for a job
-- that carried an idempotency key too (job_enqueue_unique took no change) or
-- that a depth cap refused. A holder that became processing meanwhile is
-- skipped (READ COMMITTED re-checks the row), and a replace leaves a holder in
-- the middle of a durable run, or claimed since this statement's snapshot, as
-- job_enqueue_unique_update.sql does. Rows: ('updated', id, state), or ('unique',
-- id, state) for a processing or durable holder left as it was; none when no
-- active job holds the key any more, or a claim came meanwhile (the caller asks
-- again).
WITH n AS (
    SELECT %(payload)s::jsonb AS payload, %(meta)s::jsonb AS meta, %(priority)s::int AS priority,
           coalesce(%(available_at)s::timestamptz, statement_timestamp()) AS at
), upd AS (
    UPDATE {job} j
    SET payload = CASE WHEN %(mode)s = 'replace' THEN n.payload ELSE j.payload END,
        meta = CASE WHEN %(mode)s = 'replace' THEN n.meta ELSE j.meta END,
        -- a replaced holder is another job's now: a done lost by its last run is not its (L6')
        claim_token = CASE WHEN %(mode)s = 'replace' THEN NULL ELSE j.claim_token END,
        priority = CASE WHEN %(mode)s = 'replace' THEN n.priority ELSE greatest(j.priority, n.priority) END,
        available_at = CASE WHEN %(mode)s = 'replace' THEN n.at ELSE least(j.available_at, n.at) END,
        state = CASE
            WHEN j.state IN ('scheduled', 'failed')
                 AND (CASE WHEN %(mode)s = 'replace' THEN n.at ELSE least(j.available_at, n.at) END)
                     <= statement_timestamp()
                THEN 'pending'
            WHEN j.state = 'pending'
                 AND (CASE WHEN %(mode)s = 'replace' THEN n.at ELSE least(j.available_at, n.at) END)
                     > statement_timestamp()
                THEN 'scheduled'
            ELSE j.state END,
        updated_at = now()
    FROM n
    WHERE j.topic = %(topic)s AND j.unique_key = %(unique_key)s
      AND j.state IN ('scheduled', 'pending', 'failed', 'blocked')
      AND (%(mode)s <> 'replace'
           OR (NOT EXISTS (SELECT FROM {job_step} s WHERE s.job_id = j.id)
               AND (j.claim_token IS NULL
                    OR j.claim_token = (SELECT o.claim_token FROM {job} o WHERE o.id = j.id))))
    RETURNING j.id, j.topic, j.state, j.available_at,
              (SELECT o.state FROM {job} o WHERE o.id = j.id) AS old_state,
              (SELECT o.available_at FROM {job} o WHERE o.id = j.id) AS old_at
), running AS (
    -- A processing holder, as job_enqueue_unique_update's `held` and `held_since` answer one: as
    -- the snapshot sees it at READ COMMITTED, locked as it is now under an older snapshot.
    SELECT h.id, h.state
    FROM {job} h
    WHERE h.topic = %(topic)s AND h.unique_key = %(unique_key)s AND h.state = 'processing'
      AND NOT EXISTS (SELECT FROM upd)
      AND current_setting('transaction_isolation') = 'read committed'
), running_since AS (
    SELECT h.id, h.state
    FROM {job} h
    WHERE h.topic = %(topic)s AND h.unique_key = %(unique_key)s AND h.state = 'processing'
      AND NOT EXISTS (SELECT FROM upd)
      AND current_setting('transaction_isolation') <> 'read committed'
    FOR SHARE OF h
), durable AS (
    -- A holder a replace left for its record, locked as it is now: one that ended or moved since
    -- the snapshot is not answered (READ COMMITTED reads its row again: no row, the caller asks
    -- again; REPEATABLE READ raises a serialization failure), so no ended job answers an enqueue.
    -- The lock is the one job_enqueue_unique_update's ON CONFLICT takes (a later replace of the key
    -- in the caller's transaction): a weaker one, upgraded there, deadlocked two such callers.
    SELECT h.id, h.state
    FROM {job} h
    WHERE %(mode)s = 'replace' AND NOT EXISTS (SELECT FROM upd)
      AND h.topic = %(topic)s AND h.unique_key = %(unique_key)s
      AND h.state IN ('scheduled', 'pending', 'failed', 'blocked')
      AND EXISTS (SELECT FROM {job_step} s WHERE s.job_id = h.id)
    FOR NO KEY UPDATE OF h
)
SELECT 'updated', u.id, u.state,
       CASE WHEN (u.state = 'pending' AND u.old_state IS DISTINCT FROM 'pending')
                 OR (u.state IN ('scheduled', 'failed')
                     AND (u.old_state IS DISTINCT FROM u.state OR u.old_at IS NULL OR u.available_at < u.old_at))
            THEN pg_notify(CASE WHEN u.state = 'pending' THEN {channel_literal} ELSE {stage_channel_literal} END,
                           CASE WHEN octet_length(u.topic) < 8000 THEN u.topic ELSE '' END)::text
       END
FROM upd AS u
UNION ALL
SELECT 'unique', r.id, r.state, NULL
FROM running r
UNION ALL
SELECT 'unique', r.id, r.state, NULL
FROM running_since r
UNION ALL
SELECT 'unique', d.id, d.state, NULL
FROM durable d
WHERE NOT EXISTS (SELECT FROM upd)

-- name: job_enqueue_unique_update
-- SPEC U1, U2: one job with a unique key and on_duplicate 'merge' or 'replace'
-- (and no idempotency key), in one statement: inserted, or the active holder of
-- (topic, unique_key) changed in place while it is not processing:
--   merge   - priority the higher of the two, available_at the earlier;
--   replace - payload, meta, priority and available_at the new job's.
-- A waiting holder whose new available_at is due becomes pending (the engines
-- are woken); a pending one pushed into the future becomes scheduled, and a
-- scheduled or failed one moved in time wakes the stagers (their channel). The
-- old values come from the statement's snapshot (a sub-select in RETURNING).
-- A holder in the middle of a durable run (SPEC DS1: a step, sleep or wait
-- recorded) is not replaced either: its record was made from its payload, which a
-- replace would swap under it (its steps replayed for another job's payload, its
-- wait's timeout moved); a merge changes no payload and may wake it early (the run
-- goes back to its sleep or wait). It is met through the conflict, on its current
-- row (a holder ended since the snapshot is no conflict, a REPEATABLE READ caller
-- whose snapshot is older than the row gets a serialization failure), and left by
-- the DO UPDATE's WHERE, which reads job_step in the snapshot: a claim made after
-- it (a new claim_token on the row) may have recorded steps since, so that holder
-- is left too, as one this statement met processing (it was, during the statement).
-- A holder this statement's snapshot sees processing is not even tried: ON
-- CONFLICT DO UPDATE locks the row it meets, its WHERE false or not, and that
-- lock would last to the end of the caller's transaction, keeping the running
-- job's renewals and done from its row (SPEC L3'). (A claim committed while this
-- statement waits on it still leaves that lock: the holder is then answered
-- as processing all the same.)
-- Rows: ('created', id, state) or ('updated', id, state); else ('unique', id,
-- state) for a holder left as it was (processing, or the cap refused the
-- insert so nothing conflicted); ('full', NULL, NULL) when the depth cap
-- (%(cap)s, %(base)s, %(seq0)s, %(cp_m)s: as in job_enqueue) refused it; every
-- row ends with job_enqueue's four columns. No row: ask again.
WITH {depth_room}
), ins AS (
    INSERT INTO {job} AS j (id, topic, payload, unique_key, meta, available_at, priority, state{tenant_col})
    SELECT %(id)s, %(topic)s, %(payload)s::jsonb, %(unique_key)s, %(meta)s::jsonb, a.at, %(priority)s,
           CASE WHEN a.at > statement_timestamp() THEN 'scheduled' ELSE 'pending' END{tenant_param}
    FROM a
    WHERE a.room
      AND NOT EXISTS (SELECT FROM {job} p
                      WHERE p.topic = %(topic)s AND p.unique_key = %(unique_key)s AND p.state = 'processing')
    ON CONFLICT (topic, unique_key)
        WHERE unique_key IS NOT NULL AND state IN ('scheduled', 'pending', 'processing', 'failed', 'blocked')
    DO UPDATE SET
        payload = CASE WHEN %(mode)s = 'replace' THEN excluded.payload ELSE j.payload END,
        meta = CASE WHEN %(mode)s = 'replace' THEN excluded.meta ELSE j.meta END,
        -- a replaced holder is another job's now: a done lost by its last run is not its (L6')
        claim_token = CASE WHEN %(mode)s = 'replace' THEN NULL ELSE j.claim_token END,
        priority = CASE WHEN %(mode)s = 'replace' THEN excluded.priority
                        ELSE greatest(j.priority, excluded.priority) END,
        available_at = CASE WHEN %(mode)s = 'replace' THEN excluded.available_at
                            ELSE least(j.available_at, excluded.available_at) END,
        state = CASE
            WHEN j.state IN ('scheduled', 'failed')
                 AND (CASE WHEN %(mode)s = 'replace' THEN excluded.available_at
                           ELSE least(j.available_at, excluded.available_at) END) <= statement_timestamp()
                THEN 'pending'
            WHEN j.state = 'pending'
                 AND (CASE WHEN %(mode)s = 'replace' THEN excluded.available_at
                           ELSE least(j.available_at, excluded.available_at) END) > statement_timestamp()
                THEN 'scheduled'
            ELSE j.state END,
        updated_at = now()
    WHERE j.state <> 'processing'
      AND (%(mode)s <> 'replace'
           OR (NOT EXISTS (SELECT FROM {job_step} s WHERE s.job_id = j.id)
               AND (j.claim_token IS NULL
                    OR j.claim_token = (SELECT o.claim_token FROM {job} o WHERE o.id = j.id))))
    RETURNING j.id, j.topic, j.state, j.available_at,
              (SELECT o.state FROM {job} o WHERE o.id = j.id) AS old_state,
              (SELECT o.available_at FROM {job} o WHERE o.id = j.id) AS old_at
), held AS (
    -- The holder answered when nothing was inserted nor changed, as this statement's snapshot sees
    -- it: at READ COMMITTED that snapshot is this statement's own, and a holder that ends while it
    -- runs was one the enqueue met active. A caller's REPEATABLE READ or SERIALIZABLE snapshot may be
    -- older than the holder's end: there the row is locked as it is now (FOR SHARE, the first lock
    -- that an engine's write of it conflicts with), a serialization failure for a row written since
    -- (docs/unique-jobs.md), so no ended job answers an enqueue; the holder's own outcome waits for
    -- that caller's commit (SPEC L3'), as it does for any lock a caller holds on its row.
    SELECT h.id, h.state
    FROM {job} h
    WHERE h.topic = %(topic)s AND h.unique_key = %(unique_key)s
      AND h.state IN ('scheduled', 'pending', 'processing', 'failed', 'blocked')
      AND NOT EXISTS (SELECT FROM ins)
      AND current_setting('transaction_isolation') = 'read committed'
), held_since AS (
    SELECT h.id, h.state
    FROM {job} h
    WHERE h.topic = %(topic)s AND h.unique_key = %(unique_key)s
      AND h.state IN ('scheduled', 'pending', 'processing', 'failed', 'blocked')
      AND NOT EXISTS (SELECT FROM ins)
      AND current_setting('transaction_isolation') <> 'read committed'
    FOR SHARE OF h
)
SELECT r.*, a.seq, a.seen, a.anchor, a.horizon
FROM (
SELECT CASE WHEN i.id = %(id)s THEN 'created' ELSE 'updated' END, i.id, i.state,
       CASE WHEN i.id <> %(id)s AND (
                (i.state = 'pending' AND i.old_state IS DISTINCT FROM 'pending')
                OR (i.state IN ('scheduled', 'failed')
                    AND (i.old_state IS DISTINCT FROM i.state OR i.old_at IS NULL OR i.available_at < i.old_at)))
            THEN pg_notify(CASE WHEN i.state = 'pending' THEN {channel_literal} ELSE {stage_channel_literal} END,
                           CASE WHEN octet_length(i.topic) < 8000 THEN i.topic ELSE '' END)::text
       END
FROM ins AS i
UNION ALL
SELECT 'unique', h.id, h.state, NULL
FROM held h
UNION ALL
SELECT 'unique', h.id, h.state, NULL
FROM held_since h
UNION ALL
SELECT 'full', NULL, NULL, NULL FROM a WHERE NOT a.room
) AS r, a

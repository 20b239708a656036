-- name: job_enqueue
-- One job with an idempotency key, or of a depth-capped topic: a (topic, key)
-- already present inserts nothing (never a unique violation into the caller's
-- transaction: SPEC E1, E2).
-- SPEC F2: %(cap)s is the topic's max_depth as the Store last read it (NULL:
-- uncapped: nothing is counted). While the Store's anchor for the topic
-- (%(base)s waiting jobs, the depth sequence at %(seq0)s: migration 0014) plus
-- the values taken since, and this job, stays within the cap, there is room
-- and nothing is counted. Otherwise the waiting jobs are counted, stopping at
-- the cap (the claim index for pending rows, the waiting index for the
-- others), and a topic with that many inserts nothing. A job to write takes
-- its transaction's id, then the next value of the sequence (a refusal takes
-- neither, and commits nothing to flush). %(cp_m)s is the horizon of the
-- Store's checkpoint (see flow/limits.py): when no other transaction below it is in
-- progress in this snapshot, every value below the checkpoint's is in this
-- count or was rolled back, and the count may anchor the Store. Each row ends
-- with (the value taken or NULL, the count or NULL, the count again if it may
-- anchor, this statement's horizon: the first transaction id not yet assigned
-- when its snapshot was taken, READ COMMITTED only).
-- Rows: (id, true, ...) when inserted; (NULL, false, ...) when the cap refused
-- it; none for a key already present. available_at defaults to the statement's
-- time, not the transaction's; a job due later than that is scheduled, and the
-- stager makes it pending (SPEC S5).
WITH {depth_room}
), p AS (
    -- SPEC F3: a parking topic's job is parked, never refused, when there is no room or
    -- parked jobs wait already (it does not jump them): one probe of job_parked_idx.
    SELECT %(park)s::bool
           AND (NOT a.room OR EXISTS (SELECT FROM {job} WHERE topic = %(topic)s AND state = 'parked')) AS parked
    FROM a
), ins AS (
    INSERT INTO {job} (id, topic, payload, idempotency_key, meta, available_at, priority, state{tenant_col})
    SELECT %(id)s, %(topic)s, %(payload)s::jsonb, %(key)s, %(meta)s::jsonb, a.at, %(priority)s,
           CASE WHEN p.parked THEN 'parked' WHEN a.at > statement_timestamp() THEN 'scheduled' ELSE 'pending' END{tenant_param}
    FROM a, p
    WHERE a.room OR p.parked
    ON CONFLICT (topic, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id
)
SELECT ins.id, true, a.seq, a.seen, a.anchor, a.horizon FROM ins, a
UNION ALL
SELECT NULL, false, a.seq, a.seen, a.anchor, a.horizon FROM a, p WHERE NOT a.room AND NOT p.parked

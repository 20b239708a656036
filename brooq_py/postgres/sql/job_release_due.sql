-- name: job_release_due
-- SPEC D2, D3, O4: applies the parents' ends that their own transactions could not
-- (migration 0016): a job_wait row whose parent has ended, because the child was locked
-- elsewhere then (an operator, another parent's end of a fan-in) or was being enqueued
-- while the parent ended. The stager runs it each tick. Everything is locked with SKIP
-- LOCKED: a child still held is left for a later tick, and two engines' sweeps never
-- apply one row twice nor wait on each other. A child is released (pending, or scheduled
-- while its time is ahead) when no parent it waits for is left, or canceled, named after
-- a parent that ended dead or canceled; a parent no longer there (deleted by hand) leaves
-- its child blocked, as its end would have. A child that takes any end (a group's
-- finally_, parents_any_end, migration 0020) counts a dead or canceled parent as ended,
-- never as doomed. One row per topic woken: how many jobs became
-- pending or scheduled; a wake-up per topic when %(notify)s.
-- SPEC DS4: it also applies the signals owed (job_signal rows not yet looked at, oldest
-- first, their jobs not running): a job scheduled waiting for one becomes pending; the
-- signal is then looked at (woke) once its job is seen not running. A running job's signal
-- is found by its handler's wait_for, or here once its attempt ended waiting.
-- SPEC DS5: a signal whose job is gone is deleted: one committed after retention deleted
-- its job (it reads the job's row without a lock, so retention cannot wait for it) would
-- otherwise stay behind. A committed signal's job was committed before it (or with it), so
-- a snapshot that sees the signal and not the job sees a deleted job.
-- SPEC B2, L3: the rows it locks and writes are active ones, in the job table alone ({live}): a
-- table of history locked by an operator (a CREATE INDEX takes SHARE) holds up no tick. A child or
-- a signalled job no longer there (ended and moved to history, or deleted) owes nothing: a signal
-- of a job moved to history is looked at, one of a job gone is deleted (orphaned).
WITH due AS (
    SELECT w.parent, w.child, p.state AS parent_state
    FROM {job_wait} w
    LEFT JOIN {job} p ON p.id = w.parent
    WHERE p.id IS NULL OR p.state IN ('done', 'dead', 'canceled')
    LIMIT %(batch)s
    FOR UPDATE OF w SKIP LOCKED
), free AS (
    SELECT c.id, coalesce(c.parents_any_end, false) AS any_end
    FROM {live} c
    WHERE c.id = ANY (ARRAY(SELECT DISTINCT d.child FROM due d))
    FOR UPDATE SKIP LOCKED
), verdict AS (
    SELECT d.child,
           count(*) FILTER (WHERE d.parent_state = 'done' OR (f.any_end AND d.parent_state IS NOT NULL)) AS done,
           min(d.parent::text || ' ended ' || d.parent_state)
               FILTER (WHERE d.parent_state IN ('dead', 'canceled') AND NOT f.any_end) AS doomed_by
    FROM due d
    JOIN free f ON f.id = d.child
    GROUP BY d.child
), changed AS (
    UPDATE {live} c
    SET state = CASE WHEN v.doomed_by IS NOT NULL THEN 'canceled'
                     WHEN c.waiting_parents > v.done THEN 'blocked'
                     WHEN c.available_at > clock_timestamp() THEN 'scheduled'
                     ELSE 'pending' END,
        waiting_parents = CASE WHEN v.doomed_by IS NOT NULL THEN c.waiting_parents
                               ELSE greatest(c.waiting_parents - v.done, 0) END,
        last_error = CASE WHEN v.doomed_by IS NOT NULL THEN 'canceled: parent ' || v.doomed_by
                          ELSE c.last_error END,
        available_at = CASE WHEN v.doomed_by IS NULL AND c.waiting_parents <= v.done
                            THEN greatest(c.available_at, clock_timestamp()) ELSE c.available_at END,
        updated_at = CASE WHEN v.doomed_by IS NOT NULL OR c.waiting_parents <= v.done
                          THEN now() ELSE c.updated_at END
    FROM verdict v
    WHERE c.id = v.child AND c.state = 'blocked'
    RETURNING c.topic, c.state
), applied AS (
    DELETE FROM {job_wait} w
    USING due d
    WHERE w.parent = d.parent AND w.child = d.child
      AND (d.child = ANY (ARRAY(SELECT f.id FROM free f))
           OR NOT EXISTS (SELECT FROM {live} c WHERE c.id = d.child))
), owed AS (
    SELECT g.job_id, g.name
    FROM {job_signal} g
    LEFT JOIN {job} w ON w.id = g.job_id
    WHERE NOT g.woke AND (w.id IS NULL OR w.state <> 'processing')
    ORDER BY g.at
    LIMIT %(batch)s
    FOR UPDATE OF g SKIP LOCKED
), waiter AS (
    SELECT j.id, j.state
    FROM {live} j
    WHERE j.id = ANY (ARRAY(SELECT o.job_id FROM owed o))
    FOR NO KEY UPDATE SKIP LOCKED
), signalled AS (
    UPDATE {live} j
    SET state = 'pending', waiting_for = NULL, available_at = now(), updated_at = now()
    FROM owed o
    WHERE j.id = o.job_id AND j.id = ANY (ARRAY(SELECT w.id FROM waiter w))
      AND j.state = 'scheduled' AND j.waiting_for = o.name
    RETURNING j.topic, j.state
), looked AS (
    UPDATE {job_signal} g
    SET woke = true
    FROM owed o
    WHERE g.job_id = o.job_id AND g.name = o.name
      AND (EXISTS (SELECT FROM waiter w WHERE w.id = o.job_id AND w.state <> 'processing')
           OR (NOT EXISTS (SELECT FROM {live} l WHERE l.id = o.job_id)
               AND EXISTS (SELECT FROM {job} h WHERE h.id = o.job_id)))
), orphaned AS (
    DELETE FROM {job_signal} g
    USING owed o
    WHERE g.job_id = o.job_id AND g.name = o.name
      AND NOT EXISTS (SELECT FROM {job} j WHERE j.id = o.job_id)
), woken AS (
    SELECT c.topic, c.state, count(*) AS n
    FROM (SELECT topic, state FROM changed UNION ALL SELECT topic, state FROM signalled) c
    WHERE c.state IN ('pending', 'scheduled')
    GROUP BY c.topic, c.state
)
SELECT w.topic, w.n::int,
       CASE WHEN %(notify)s
            THEN pg_notify(CASE WHEN w.state = 'scheduled' THEN {stage_channel_literal} ELSE {channel_literal} END,
                           CASE WHEN octet_length(w.topic) < 8000 THEN w.topic ELSE '' END)
       END AS sent
FROM woken w

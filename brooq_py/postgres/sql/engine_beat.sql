-- name: engine_beat
-- The engine's proof of life: one upsert of its own row, which nothing done to job rows can
-- block; refused ('taken') while another live engine instance holds the same id. The claims it
-- holds are read, never written or locked: no lock an operator takes on the job table short of
-- ACCESS EXCLUSIVE (a CREATE INDEX, a REINDEX: SHARE) holds it up (a handler's progress is written
-- apart, job_progress.sql). Claims the engine let go without an
-- outcome (hung, fenced) are named in its row's `dropped`, for the reaper to take back at once.
-- One row per claim sent: its token and 'held' (still processing under it), the row's state
-- under this claim ('canceled', ...), or 'gone'; and
-- with %(orphans)s (once a lease), one 'orphan' row (with its job id) per claim of this engine
-- older than a lease that it did not send: a claim whose answer never reached it (a connection
-- lost at the commit), to be dropped. That look reads every processing row.
-- SPEC Q5 with X1 (migration 0021): %(running)s names the claims whose handlers still run here (not
-- declared hung), held or not (a canceled claim is no longer held, its handler may run on); a hold
-- of a canceled sequence member this engine ran ends once its claim is not among them, which owes
-- the release of the sequence's next member, and once the claim is older than a lease (its row's
-- locked_until passed), as for an orphan: a claim committed but not yet taken in by the engine
-- when it listed its handlers is not mistaken for one ended. `lets_go` tells the cancel that
-- this engine does so.
WITH proof AS (
    INSERT INTO {engine} AS e (id, instance, host, pid, lease, margin, dropped, lets_go)
    VALUES (%(engine)s, %(instance)s::uuid, %(host)s, %(pid)s, %(lease)s, %(margin)s,
            ARRAY(SELECT t FROM unnest(%(tokens)s::uuid[], %(dropped)s::bool[]) AS d(t, dropped) WHERE dropped),
            true)
    ON CONFLICT (id) DO UPDATE
    SET seen_at = now(), instance = excluded.instance, host = excluded.host, pid = excluded.pid,
        lease = excluded.lease, margin = excluded.margin, dropped = excluded.dropped, lets_go = true
    WHERE e.instance IS NOT DISTINCT FROM excluded.instance OR e.seen_at + e.lease + e.margin < now()
    RETURNING e.id
), let_go AS (
    DELETE FROM {job_sequence_hold} h
    WHERE h.engine = %(engine)s AND h.token <> ALL (%(running)s::uuid[]) AND h.until < now()
      AND EXISTS (SELECT FROM proof)
), sent AS MATERIALIZED (
    SELECT h.id, h.token, 'processing'::text AS guard
    FROM unnest(%(ids)s::uuid[], %(tokens)s::uuid[]) AS h(id, token)
)
SELECT s.token::text,
    CASE WHEN j.id IS NULL OR j.claim_token IS DISTINCT FROM s.token THEN 'gone'
         WHEN j.state <> s.guard THEN j.state
         ELSE 'held' END,
    NULL::text
FROM sent s
LEFT JOIN {live} j ON j.id = s.id AND j.id = ANY (%(ids)s::uuid[])
WHERE EXISTS (SELECT FROM proof)
UNION ALL
SELECT o.claim_token::text, 'orphan', o.id::text
FROM {live} o
WHERE %(orphans)s::bool AND EXISTS (SELECT FROM proof) AND o.state = 'processing' AND o.locked_by = %(engine)s
    AND o.claim_token <> ALL (%(tokens)s::uuid[]) AND o.updated_at < now() - %(lease)s::interval
UNION ALL
SELECT NULL, 'taken', e.host || ':' || e.pid
FROM {engine} e
WHERE e.id = %(engine)s AND NOT EXISTS (SELECT FROM proof)

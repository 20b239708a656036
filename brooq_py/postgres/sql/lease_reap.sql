-- name: lease_reap
-- Processing rows back to pending when their engine is gone (its proof of life older than its
-- lease plus its margin, on the database clock), when the engine dropped the claim itself (hung,
-- fenced), or, with no engine row (an older engine, run_once, a stopped engine), when the row's own
-- locked_until passed. A crash is not a failure: the attempt is given back and counted in
-- `crashes` (the poison rule reads it). Rows locked elsewhere are skipped, never waited on: an
-- operator's lock only delays that row. Engine rows silent for an hour that hold nothing go too.
-- SPEC Q5 with X1 (migration 0021): the holds of canceled sequence members whose engine is gone (or
-- dropped the claim; with no engine row, past the row's locked_until) end, which owes the release of
-- each sequence's next member (the handler cannot run any more, as a reaped job's cannot).
WITH gone AS MATERIALIZED (
    SELECT j.id
    FROM {live} j
    LEFT JOIN {engine} e ON e.id = j.locked_by
    WHERE j.state = 'processing'
        AND CASE WHEN e.id IS NULL THEN j.locked_until < now()
                 ELSE e.seen_at + e.lease + e.margin < now() OR j.claim_token = ANY (e.dropped) END
    LIMIT %(limit)s
    FOR NO KEY UPDATE OF j SKIP LOCKED
), unheld AS (
    DELETE FROM {job_sequence_hold} h
    WHERE NOT EXISTS (SELECT FROM {engine} e
                      WHERE e.id = h.engine AND e.seen_at + e.lease + e.margin >= now()
                        AND NOT (h.token = ANY (e.dropped)))
      AND (h.until IS NULL OR h.until < now() OR EXISTS (SELECT FROM {engine} e WHERE e.id = h.engine))
), forgotten AS (
    DELETE FROM {engine} e
    WHERE e.seen_at < now() - interval '1 hour'
        AND NOT EXISTS (SELECT FROM {live} j WHERE j.state = 'processing' AND j.locked_by = e.id)
        AND NOT EXISTS (SELECT FROM {job_sequence_hold} h WHERE h.engine = e.id)
)
UPDATE {live} j
SET state = 'pending', locked_by = NULL, locked_until = NULL, available_at = now(),
    attempts = greatest(j.attempts - 1, 0), crashes = j.crashes + 1, updated_at = now()
FROM gone
WHERE j.id = gone.id
RETURNING j.id::text, j.topic

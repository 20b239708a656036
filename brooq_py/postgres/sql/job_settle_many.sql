-- name: job_settle_many
-- SPEC P3, C10, O4: many outcomes, each guarded by state and its claim's token;
-- rows no longer ours (canceled, reaped, claimed again) are left alone, and a row
-- another transaction holds locked is skipped, never waited on (written by a later flush).
-- Rows are found by primary key (id = ANY). The state guard is compared with a
-- column of the fenced subquery (OFFSET 0), not a literal, so the planner cannot
-- serve the update from the partial lease index instead: that index keeps an entry
-- for every row that was processing until VACUUM, and a bitmap scan of it made each
-- write cost O(jobs done since the last vacuum) - 34 ms a batch 15k jobs into a drain.
-- V1: a done writes its result; V3: a failed or dead appends (attempt, at, error,
-- traceback) to errors, the last 20 kept. V2: the uncorrelated subquery in RETURNING
-- runs once (an InitPlan), so a batch that ended jobs sends one NOTIFY on the results
-- channel, not one per job; its column is not read. The claim token tells which outcome was
-- written when a batch holds two of one job (a late outcome of an older claim beside the new).
-- DS3, DS4: a scheduled outcome (a durable sleep, a wait for a signal, a Snooze) frees the
-- claim like a pending one, and names the signal the job waits for (NULL for every other).
-- The outcomes are unnested once, in the subquery that locks their rows: joined to them
-- after the lock instead, the planner took a nested loop that unnested every array once
-- per outcome (O(n^2): 270 ms for a batch of 500, SPEC BD1).
UPDATE {live} j
SET state = u.state,
    attempts = CASE WHEN u.give_back THEN greatest(j.attempts - 1, 0) ELSE j.attempts END,
    available_at = CASE WHEN u.state IN ('failed', 'pending', 'scheduled')
                        THEN now() + make_interval(secs => u.delay) ELSE j.available_at END,
    last_error = coalesce(u.error, j.last_error),
    locked_by = CASE WHEN u.state IN ('pending', 'scheduled') THEN NULL ELSE j.locked_by END,
    locked_until = CASE WHEN u.state IN ('pending', 'scheduled') THEN NULL ELSE j.locked_until END,
    waiting_for = u.waiting,
    result = CASE WHEN u.state = 'done' THEN u.result ELSE j.result END,
    errors = CASE WHEN u.state IN ('failed', 'dead') AND u.error IS NOT NULL
                  THEN jsonb_path_query_array(
                      coalesce(j.errors, '[]'::jsonb) || jsonb_build_array(jsonb_build_object(
                          'attempt', j.attempts, 'at', now(), 'error', u.error, 'traceback', u.traceback)),
                      '$[last - 19 to last]')
                  ELSE j.errors END,
    updated_at = now()
FROM (
    SELECT o.*
    FROM {live} f
    JOIN (SELECT x.*, 'processing'::text AS guard
          FROM unnest(%(ids)s::uuid[], %(tokens)s::uuid[], %(states)s::text[], %(delays)s::float8[],
                      %(give_back)s::bool[], %(errors)s::text[], %(results)s::jsonb[], %(tracebacks)s::text[],
                      %(waits)s::text[])
              AS x(id, token, state, delay, give_back, error, result, traceback, waiting)
          OFFSET 0) o ON f.id = o.id
    WHERE f.id = ANY (%(ids)s::uuid[]) AND f.state = o.guard AND f.claim_token = o.token
    FOR NO KEY UPDATE OF f SKIP LOCKED
) AS u
WHERE j.id = u.id
RETURNING j.id::text, (SELECT pg_notify({settled_channel_literal}, '') WHERE %(notify)s::bool),
    j.claim_token::text

-- name: lease_renew
-- SPEC C3, L3, P1', X2': every lease still ours in one statement; claim tokens only, never payloads.
-- Rows locked by someone else (an operator's open transaction in psql, a closing
-- transaction) are skipped, never waited for, and still reported held ('locked'): the
-- lease is still ours, only not extended this time; an expired one is extended by the
-- first renewal after the lock is gone (the reaper skips locked rows too). A row
-- canceled under this claim is reported 'canceled' (an operator's cancel, not a lost
-- lease). Found by primary key, the state guard hidden from the planner in a
-- materialized CTE (the partial lease index holds dead entries until VACUUM).
-- V4: progress and progress_note reported since the last renewal ride along (NULL:
-- unchanged); a row skipped as locked keeps its old ones (the engine sends them again).
-- P1': a claim reported 'locked' is guarded by a session-level advisory lock of this
-- session (the heartbeat's own, which lives as long as the engine), keyed by its claim
-- token: the reaper never takes a row whose guard is held (lease_reap.sql), and the guard
-- ends with the session when the engine dies. Third column, for 'locked' rows only: 'kept'
-- (already held: %(guarded)s), 'taken' (taken now), 'pooled' (not taken: this statement
-- does not run on the backend the client connected to, %(pid)s: a connection pooler, where
-- a session lock would stay behind on a shared server connection), 'full' (not taken: the
-- session holds max_locks_per_transaction guards already, its share of the server's lock
-- table, which every session and every new connection needs: the reaper's hold alone keeps
-- that claim) or 'busy' (another session holds the key this instant: tried again at the
-- next renewal).
WITH held AS MATERIALIZED (
    SELECT h.id, h.token, h.progress, h.note, 'processing'::text AS guard, 'canceled'::text AS gone
    FROM unnest(%(ids)s::uuid[], %(tokens)s::uuid[], %(progress)s::real[], %(notes)s::text[])
        AS h(id, token, progress, note)
), free AS MATERIALIZED (
    SELECT j.id, h.progress, h.note
    FROM {job} j
    JOIN held h ON j.id = h.id
    WHERE j.id = ANY (%(ids)s::uuid[]) AND j.state = h.guard AND j.claim_token = h.token
    FOR NO KEY UPDATE OF j SKIP LOCKED
), renewed AS (
    UPDATE {job} j
    SET locked_until = now() + %(lease)s::interval,
        progress = coalesce(free.progress, j.progress),
        progress_note = coalesce(free.note, j.progress_note)
    FROM free
    WHERE j.id = free.id
    RETURNING j.claim_token
), blocked AS MATERIALIZED (
    SELECT h.token, j.state = h.guard AS locked, h.token = ANY (%(guarded)s::uuid[]) AS kept
    FROM {job} j
    JOIN held h ON j.id = h.id
    WHERE j.id = ANY (%(ids)s::uuid[]) AND j.claim_token = h.token
        AND (j.state = h.gone OR (j.state = h.guard AND j.id NOT IN (SELECT id FROM free)))
), ranked AS (
    SELECT b.token, b.locked, b.kept,
        row_number() OVER (PARTITION BY b.locked AND NOT b.kept ORDER BY b.token) AS n
    FROM blocked b
)
SELECT claim_token::text, 'renewed', NULL::text FROM renewed
UNION ALL
SELECT r.token::text,
    CASE WHEN r.locked THEN 'locked' ELSE 'canceled' END,
    CASE
        WHEN NOT r.locked THEN NULL
        WHEN r.kept THEN 'kept'
        WHEN pg_backend_pid() <> %(pid)s::int THEN 'pooled'
        WHEN r.n > current_setting('max_locks_per_transaction')::int - cardinality(%(guarded)s::uuid[])
            THEN 'full'
        WHEN pg_try_advisory_lock({guard_class}, hashtext(r.token::text)) THEN 'taken'
        ELSE 'busy'
    END
FROM ranked r

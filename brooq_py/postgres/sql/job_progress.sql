-- name: job_progress
-- SPEC V4: the progress handlers reported since the last renewal, written after the engine's proof
-- of life (engine_beat.sql) and apart from it, only while each row is still processing under its
-- claim. A row locked elsewhere is skipped, never waited on; a lock on the table (an operator's
-- CREATE INDEX) fails this statement at the connection's lock_timeout, not the proof: what is not
-- written waits for the next renewal. One row per claim written: its token.
WITH sent AS MATERIALIZED (
    SELECT h.id, h.token, h.progress, h.note
    FROM unnest(%(ids)s::uuid[], %(tokens)s::uuid[], %(progress)s::real[], %(notes)s::text[])
        AS h(id, token, progress, note)
    WHERE h.progress IS NOT NULL OR h.note IS NOT NULL
), reported AS MATERIALIZED (
    SELECT j.id, s.progress, s.note
    FROM {live} j
    JOIN sent s ON j.id = s.id
    WHERE j.id = ANY (ARRAY(SELECT id FROM sent)) AND j.state = 'processing' AND j.claim_token = s.token
    FOR NO KEY UPDATE OF j SKIP LOCKED
)
UPDATE {live} j
SET progress = coalesce(r.progress, j.progress), progress_note = coalesce(r.note, j.progress_note)
FROM reported r
WHERE j.id = r.id
RETURNING j.claim_token::text

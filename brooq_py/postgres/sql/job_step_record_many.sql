-- name: job_step_record_many
-- SPEC DS1-DS4: job_step_record for the records of several runs at once (one statement, one
-- commit for the handlers that asked together): each written only while its job is processing
-- under its claim token, the job's row held FOR SHARE until the commit. One row per record:
-- its job and position, ours, inserted, the result recorded there, now().
WITH input AS MATERIALIZED (
    SELECT *
    FROM unnest(%(ids)s::uuid[], %(tokens)s::uuid[], %(seqs)s::int[], %(names)s::text[],
                %(kinds)s::text[], %(results)s::jsonb[], %(delays)s::float8[], %(untils)s::timestamptz[])
        AS i(id, token, seq, name, kind, result, delay, until)
), mine AS MATERIALIZED (
    SELECT j.id, j.claim_token
    FROM {job} j
    WHERE j.id = ANY (%(ids)s::uuid[]) AND j.state = 'processing'
      AND j.claim_token = ANY (%(tokens)s::uuid[])
    FOR SHARE OF j
), earlier AS MATERIALIZED (
    SELECT s.job_id, s.seq, s.result
    FROM {job_step} s JOIN input i ON s.job_id = i.id AND s.seq = i.seq
), recorded AS (
    INSERT INTO {job_step} (job_id, seq, name, kind, result)
    SELECT i.id, i.seq, i.name, i.kind,
           CASE WHEN i.kind = 'step' THEN i.result
                ELSE jsonb_build_object('until', coalesce(i.until, now() + make_interval(secs => i.delay))) END
    FROM input i JOIN mine m ON m.id = i.id AND m.claim_token = i.token
    ON CONFLICT (job_id, seq) DO NOTHING
    RETURNING job_id, seq, result
)
SELECT i.id::text, i.seq, m.id IS NOT NULL, r.job_id IS NOT NULL, coalesce(r.result, e.result), now()
FROM input i
LEFT JOIN mine m ON m.id = i.id AND m.claim_token = i.token
LEFT JOIN recorded r ON r.job_id = i.id AND r.seq = i.seq
LEFT JOIN earlier e ON e.job_id = i.id AND e.seq = i.seq

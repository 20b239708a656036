-- name: job_step_time_out
-- SPEC DS4: a wait_for whose timeout a run has seen passed records that decision in its wait's
-- row (its result gains "timed_out": true), fenced on the claim token as job_step_record is, so
-- every later run raises SignalTimeout too: a signal's `at` is its transaction's start, so one
-- committed after that run may still say it came before the timeout. One row: ours (false: the
-- job is no longer this attempt's, nothing written).
WITH mine AS MATERIALIZED (
    SELECT id FROM {job}
    WHERE id = %(id)s AND state = 'processing' AND claim_token = %(token)s
    FOR SHARE
), marked AS (
    UPDATE {job_step} s
    SET result = s.result || jsonb_build_object('timed_out', true)
    FROM mine m
    WHERE s.job_id = m.id AND s.seq = %(seq)s AND s.kind = 'wait'
)
SELECT EXISTS (SELECT FROM mine)

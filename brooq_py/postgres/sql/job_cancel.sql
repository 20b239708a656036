-- name: job_cancel
-- SPEC X1: active rows only; terminal rows are never touched. The job's blocked
-- descendants are canceled with it by the trigger job_parent_ended (SPEC D3).
-- V2: a cancel wakes the waiters on the results channel (once; the column is not read).
UPDATE {job}
SET state = 'canceled', updated_at = now()
WHERE id = %(id)s AND state IN ('pending', 'scheduled', 'failed', 'processing', 'blocked', 'parked')
RETURNING id, (SELECT pg_notify({settled_channel_literal}, ''))

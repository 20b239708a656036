-- name: job_cancel
-- SPEC X1: active rows only; terminal rows are never touched.
UPDATE {job}
SET state = 'canceled', updated_at = now()
WHERE id = %(id)s AND state IN ('pending', 'scheduled', 'failed', 'processing')
RETURNING id

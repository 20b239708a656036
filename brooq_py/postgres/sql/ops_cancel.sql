-- name: ops_cancel
-- Cancel from psql (SPEC X1, X2'): a running job is told at once by the cancel trigger's NOTIFY
-- (migration 0011), its heartbeat the fallback.
-- Blocked descendants are canceled with it by the trigger job_parent_ended (SPEC D3).
UPDATE {job}
SET state = 'canceled', updated_at = now()
WHERE id = %(id)s AND state IN ('pending', 'scheduled', 'failed', 'processing', 'blocked', 'parked')

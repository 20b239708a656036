-- name: ops_cancel
-- Cancel from psql (SPEC X1): a running job stops through lease loss within lease/3.
-- Blocked descendants are canceled with it by the trigger job_parent_ended (SPEC D3).
UPDATE {job}
SET state = 'canceled', updated_at = now()
WHERE id = %(id)s AND state IN ('pending', 'scheduled', 'failed', 'processing', 'blocked')

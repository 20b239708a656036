-- name: lease_reap
-- SPEC R1: expired leases back to pending, attempts unchanged; guarded by state,
-- so terminal rows (which keep their old locked_until) are never resurrected.
UPDATE {job}
SET state = 'pending', locked_by = NULL, locked_until = NULL, available_at = now(), updated_at = now()
WHERE state = 'processing' AND locked_until < now()
RETURNING id, topic

-- name: job_settle_one
-- One guarded outcome inside the caller's transaction (done + chained enqueues).
UPDATE {job}
SET state = %(state)s,
    attempts = CASE WHEN %(give_back)s THEN greatest(attempts - 1, 0) ELSE attempts END,
    available_at = CASE WHEN %(state)s IN ('failed', 'pending') THEN now() + %(delay)s::interval
                        ELSE available_at END,
    last_error = coalesce(%(error)s, last_error),
    locked_by = CASE WHEN %(state)s = 'pending' THEN NULL ELSE locked_by END,
    locked_until = CASE WHEN %(state)s = 'pending' THEN NULL ELSE locked_until END,
    updated_at = now()
WHERE id = %(id)s AND state = 'processing' AND claim_token = %(token)s
RETURNING id

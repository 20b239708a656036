-- name: job_lock_own
-- O4, C9: the first statement of a closing transaction (chain, on_succeeded): lock the job's
-- row FOR NO KEY UPDATE SKIP LOCKED, never waited for, the lock held until that transaction
-- ends, so that none of its chained enqueues or callbacks runs while another transaction holds
-- the row. 'ours': locked now, still processing under the claim; 'locked': still the claim's,
-- but another transaction (an operator's open one in psql) holds the row (the transaction rolls
-- back and is tried again from the completer's queue); 'gone': no longer the claim's
-- (canceled, reaped, claimed again). The second probe reads without a lock.
WITH mine AS MATERIALIZED (
    SELECT id FROM {live}
    WHERE id = %(id)s AND state = 'processing' AND claim_token = %(token)s
    FOR NO KEY UPDATE SKIP LOCKED
)
SELECT CASE WHEN EXISTS (SELECT 1 FROM mine) THEN 'ours'
            WHEN EXISTS (SELECT 1 FROM {live}
                         WHERE id = %(id)s AND state = 'processing' AND claim_token = %(token)s)
            THEN 'locked'
            ELSE 'gone' END

-- name: job_lock_own
-- L3', C9: the probe before a closing transaction (chain, on_succeeded) tried again after its
-- row was found locked elsewhere: FOR NO KEY UPDATE SKIP LOCKED, never waited for, the lock
-- ending with the statement, so that nothing of the transaction runs again while another
-- transaction holds the row. 'ours': free, still processing under the claim; 'locked': still
-- the claim's, but another transaction (an operator's open one in psql) holds the row; 'gone':
-- no longer the claim's (canceled, reaped, claimed again). The second probe reads without a lock.
WITH mine AS MATERIALIZED (
    SELECT id FROM {job}
    WHERE id = %(id)s AND state = 'processing' AND claim_token = %(token)s
    FOR NO KEY UPDATE SKIP LOCKED
)
SELECT CASE WHEN EXISTS (SELECT 1 FROM mine) THEN 'ours'
            WHEN EXISTS (SELECT 1 FROM {job}
                         WHERE id = %(id)s AND state = 'processing' AND claim_token = %(token)s)
            THEN 'locked'
            ELSE 'gone' END

-- name: job_terminal_lock
-- SPEC T1, T2: retention's first statement, in the transaction of job_delete_terminal: one
-- batch of terminal rows older than the ttl, oldest first, locked.
-- SPEC D4: a parent only once every child naming it is terminal (one probe of job_edge's
-- primary key per candidate: a child may name a parent that had already ended, which is
-- never written, so the row itself cannot tell). This snapshot may miss a child committed
-- after it was taken and before the lock below: job_delete_terminal looks again, in a
-- snapshot taken after the lock.
-- A parent locked by an enqueue naming it is skipped (SKIP LOCKED); an enqueue that locks it
-- after this statement waits for the delete, then finds it gone (InvalidJob).
SELECT j.id
FROM {job} j
WHERE j.state IN ('done', 'dead', 'canceled') AND j.updated_at < now() - %(ttl)s::interval
  AND NOT EXISTS (SELECT FROM {job_edge} e JOIN {job} c ON c.id = e.child
                  WHERE e.parent = j.id AND c.state NOT IN ('done', 'dead', 'canceled'))
ORDER BY j.updated_at
LIMIT %(batch)s
FOR UPDATE SKIP LOCKED

-- name: job_lock_free
-- L3': inside the transaction of an outcome batch that met a row locked elsewhere, lock the
-- batch's rows no one else holds (SKIP LOCKED, never waited for); the batch is then written
-- for those alone, and a locked row delays only its own outcome.
SELECT id::text FROM {job} WHERE id = ANY (%(ids)s::uuid[]) FOR NO KEY UPDATE SKIP LOCKED

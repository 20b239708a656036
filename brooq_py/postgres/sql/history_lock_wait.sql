-- name: history_lock_wait
-- SPEC B2: how long a statement creating or dropping a table of history waits for its locks: a
-- drop's waiting lock holds up every later reader of job, so it gives up soon and tries again at
-- the next pass.
SET LOCAL lock_timeout = '1s'

-- name: history_lock_table
-- SPEC B2: a day's table of history, locked for its drop; waits at most the transaction's
-- lock_timeout (a reader of job holds every table of history while it reads).
LOCK TABLE {history} IN ACCESS EXCLUSIVE MODE

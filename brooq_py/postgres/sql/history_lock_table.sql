-- name: history_lock_table
-- SPEC B2: a day's table of history, locked for its drop, or an error at once (NOWAIT): a waiting
-- ACCESS EXCLUSIVE lock would hold up every later reader of job behind it (a reader of job holds
-- every table of history while it reads), the triggers of a settle among them.
LOCK TABLE ONLY {history} IN ACCESS EXCLUSIVE MODE NOWAIT

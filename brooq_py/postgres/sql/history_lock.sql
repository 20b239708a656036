-- name: history_lock
-- SPEC B2: the mover's first statement, in the transaction of history_move: one batch of terminal
-- rows of the job table that ended more than %(after)s ago (and less than the ttl ago: older ones
-- are retention's to delete), from %(since)s on (the mover's mark: the rows before it that it
-- left, it leaves), oldest first, locked, each with the day of its end (UTC).
-- Left in the job table, as retention leaves them: the rows terminal_kept.sql keeps. Also left: a
-- job with an idempotency key (SPEC E2: the key holds while its row exists, and the enqueue's
-- ON CONFLICT sees the job table's unique index only); retention deletes it at the ttl.
-- A row locked elsewhere (an enqueue naming it as a parent, an operator) is skipped, and so are the
-- rows of a day whose table this role may not write into (%(open)s: the days of history_tables.sql
-- ours and writable), or, when no table of the day's name exists, may not make (%(made)s: every
-- table of a day's name; %(creatable)s): they stay, as retention leaves them.
SELECT j.id, to_char(j.updated_at AT TIME ZONE 'UTC', 'YYYYMMDD'), j.updated_at
FROM {live} j
WHERE j.state IN ('done', 'dead', 'canceled')
  AND j.updated_at < now() - %(after)s::interval
  AND j.updated_at >= greatest(now() - %(ttl)s::interval, %(since)s::timestamptz)
  AND j.idempotency_key IS NULL
  AND NOT {terminal_kept}
  AND (to_char(j.updated_at AT TIME ZONE 'UTC', 'YYYYMMDD') = ANY (%(open)s::text[])
       OR (%(creatable)s AND to_char(j.updated_at AT TIME ZONE 'UTC', 'YYYYMMDD') <> ALL (%(made)s::text[])))
ORDER BY j.updated_at
LIMIT %(batch)s
FOR UPDATE SKIP LOCKED

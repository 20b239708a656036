-- name: schedule_tick_advance
-- Record %(tick)s as the schedule's last tick, only when it is later than the one recorded
-- (SPEC Q4'); a row comes back when it was. An engine advancing the same schedule at once
-- waits on the row (or its key) and then sees the new last_tick: one transaction per tick
-- gets a row. The caller enqueues the tick's job in the same transaction, so a tick is never
-- recorded without its job, and a tick whose job retention deleted is never enqueued again.
INSERT INTO {schedule_tick} AS s (name, last_tick)
VALUES (%(name)s, %(tick)s)
ON CONFLICT (name) DO UPDATE SET last_tick = excluded.last_tick, updated_at = now()
WHERE s.last_tick < excluded.last_tick
RETURNING s.name

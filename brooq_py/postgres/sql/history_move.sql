-- name: history_move
-- SPEC B2: moves the rows history_lock locked (of one day) into that day's table, in the same
-- transaction: a DELETE from the job table and an INSERT, one statement. A reader sees the row in
-- one table or the other, never both, never neither. A statement waiting on the row (a cancel
-- UPDATE, FOR UPDATE) finds it gone when this commits and takes nothing: the row was terminal,
-- which it would have left alone (job_retry.sql looks for it again).
-- SPEC D4, Q5 as job_delete_terminal.sql: terminal_kept.sql again in this statement's snapshot,
-- taken after the locks, which sees every child committed before them.
-- Its edges, steps and signals stay where they are: they name the job by id, wherever it is.
WITH moved AS (
    -- By the primary key alone: the rows are locked, ended, since history_lock (with "state IN" here,
    -- statistics behind the moves had the planner walk the retention index instead, 0.5 s a batch).
    -- A job id the day holds already (a row copied back to job by hand with psql) stays in job,
    -- where retention deletes it at the ttl: the rest moves.
    DELETE FROM {live} j
    WHERE j.id = ANY (%(ids)s::uuid[])
      AND NOT {terminal_kept}
      AND NOT EXISTS (SELECT FROM ONLY {history} h WHERE h.id = j.id)
    RETURNING j.*
), put AS (
    INSERT INTO {history}
    SELECT * FROM moved
    RETURNING id, topic
)
-- How many it deleted, and what it inserted: the mover rolls back a move that put fewer rows than it
-- took (history_tables.sql lets no trigger nor rule at a day, but a row must never be lost).
SELECT (SELECT count(*) FROM moved), array_agg(p.id::text), array_agg(p.topic) FROM put p

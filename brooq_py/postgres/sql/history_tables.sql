-- name: history_tables
-- SPEC B2: the days of terminal history, each a table that inherits job (history_create.sql), and
-- whether its every row ended more than %(ttl)s ago (its day ended before; a ttl of 0: no).
SELECT d.day,
       %(ttl)s::interval > interval '0'
       AND (to_date(d.day, 'YYYYMMDD') + 1)::timestamp AT TIME ZONE 'UTC' < now() - %(ttl)s::interval
FROM (
    SELECT substr(c.relname, 13) AS day
    FROM pg_inherits i
    JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = to_regclass({job_literal})
      AND c.relname ~ '^job_history_[0-9]{{8}}$'
) AS d
ORDER BY d.day

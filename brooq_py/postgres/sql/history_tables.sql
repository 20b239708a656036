-- name: history_tables
-- SPEC B2: the tables of the job table's schema named as days of terminal history
-- (job_history_YYYYMMDD) and what this engine's role may do with each, read from the catalog at
-- every pass and never remembered: a grant, an owner or a table an operator changes counts from
-- the next pass on.
--   ours: a child of job as history_create.sql makes it (its two checks, no column of its own);
--     any other table of such a name (made by hand, or by another role with CREATE on the schema)
--     is never written, emptied nor dropped;
--   writable: the mover may insert into it and read back what it inserted;
--   owned: the role may drop it (its owner's alone); emptiable: it may delete its rows instead;
--   past: its every row ended more than %(ttl)s ago (its day ended before the day of now - ttl;
--     a ttl of 0: no).
-- And on every row, whether the role may make a day (CREATE TABLE … INHERITS is the owner's of
-- job, in a schema it may create in): a row of its own, day NULL, when no table exists.
SELECT t.day, t.ours, t.writable, t.owned, t.emptiable, t.past, p.creatable
FROM (
    SELECT c.oid, c.relnamespace,
           pg_has_role(c.relowner, 'USAGE') AND has_schema_privilege(c.relnamespace, 'CREATE') AS creatable,
           (SELECT count(*) FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped) AS columns
    FROM pg_class c
    WHERE c.oid = to_regclass({job_literal})
) AS p
LEFT JOIN LATERAL (
    SELECT substr(c.relname, 13) AS day,
           EXISTS (SELECT FROM pg_inherits i WHERE i.inhrelid = c.oid AND i.inhparent = p.oid)
           AND (SELECT count(*) FROM pg_constraint k
                WHERE k.conrelid = c.oid AND k.conname IN ('job_history_terminal', 'job_history_keyless')) = 2
           AND (SELECT count(*) FROM pg_attribute a
                WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped) = p.columns AS ours,
           has_table_privilege(c.oid, 'INSERT') AND has_table_privilege(c.oid, 'SELECT') AS writable,
           pg_has_role(c.relowner, 'USAGE') AS owned,
           has_table_privilege(c.oid, 'DELETE') AND has_table_privilege(c.oid, 'SELECT') AS emptiable,
           -- compared as text: a name that is no date (job_history_20261399) is never an error
           %(ttl)s::interval > interval '0'
           AND substr(c.relname, 13) < to_char((now() - %(ttl)s::interval) AT TIME ZONE 'UTC', 'YYYYMMDD') AS past
    FROM pg_class c
    WHERE c.relnamespace = p.relnamespace AND c.relname ~ '^job_history_[0-9]{{8}}$'
) AS t ON true
ORDER BY t.day

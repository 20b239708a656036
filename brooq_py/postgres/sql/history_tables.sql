-- name: history_tables
-- SPEC B2 (after history_scope, in its transaction): the tables of the job table's schema named as days of terminal history
-- (job_history_YYYYMMDD), and the types of such a name that are no table's (a domain, an enum: the
-- day's table cannot be made), with what this engine's role may do with each, read from the
-- catalog at every pass and never remembered: a grant, an owner or a table an operator changes
-- counts from the next pass on.
--   ours: a child of job as history_create.sql makes it: its two checks and its primary key (none
--     deferrable: a move must fail in its statement, not at the commit) and no other constraint of its own, job's columns in job's order (the moves copy rows by position),
--     no trigger, rule nor row-level security (each could refuse, drop or hide a row moved); any
--     other table of such a name (made by hand, or by another role with CREATE on the schema) is
--     never written, emptied nor dropped;
--   writable: the mover may insert into it and read back what it inserted;
--   owned: the role may drop it (its owner's alone); emptiable: it may delete its rows instead;
--   past: its every row ended more than %(ttl)s ago (its day ended before the day of now - ttl,
--     compared as text: a name that is no date is never an error; a ttl of 0: no); overdue: past
--     an hour ago (a role that may not drop it empties it then, once an owner's engine, whose
--     retention passes come at least hourly by default, had the time to drop it whole).
-- And on every row, whether the role owns job and whether it may create in its schema (it may make
-- a day with both: CREATE TABLE … INHERITS is the owner's of job): a row of its own, day NULL, when
-- no day exists.
WITH p AS (
    SELECT c.oid, c.relnamespace,
           pg_has_role(c.relowner, 'USAGE') AS owner, has_schema_privilege(c.relnamespace, 'CREATE') AS create,
           array(SELECT (a.attname, a.atttypid, a.atttypmod, a.attnotnull)::text FROM pg_attribute a
                 WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum) AS columns
    FROM pg_class c
    WHERE c.oid = to_regclass({job_literal})
), named AS (
    SELECT substr(c.relname, 13) AS day, c.oid, c.relowner, c.relrowsecurity, c.relhasrules
    FROM pg_class c, p
    WHERE c.relnamespace = p.relnamespace AND c.relname ~ '^job_history_[0-9]{{8}}$'
    UNION ALL
    SELECT substr(t.typname, 13), NULL, NULL, NULL, NULL
    FROM pg_type t, p
    WHERE t.typnamespace = p.relnamespace AND t.typrelid = 0 AND t.typname ~ '^job_history_[0-9]{{8}}$'
)
SELECT t.day, t.ours, t.writable, t.owned, t.emptiable, t.past, t.overdue, p.owner, p.create
FROM p
LEFT JOIN LATERAL (
    SELECT n.day,
           n.oid IS NOT NULL AND NOT n.relrowsecurity AND NOT n.relhasrules
           AND EXISTS (SELECT FROM pg_inherits i WHERE i.inhrelid = n.oid AND i.inhparent = p.oid)
           AND NOT EXISTS (SELECT FROM pg_trigger g WHERE g.tgrelid = n.oid AND NOT g.tgisinternal)
           AND (SELECT array_agg(k.contype::text || CASE WHEN k.contype = 'c' THEN ' ' || k.conname ELSE '' END
                                 || CASE WHEN k.condeferrable THEN ' deferrable' ELSE '' END
                                 ORDER BY k.contype, k.conname)
                FROM pg_constraint k WHERE k.conrelid = n.oid AND k.conislocal)
               = ARRAY['c job_history_keyless', 'c job_history_terminal', 'p']
           AND array(SELECT (a.attname, a.atttypid, a.atttypmod, a.attnotnull)::text FROM pg_attribute a
                     WHERE a.attrelid = n.oid AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum)
               = p.columns AS ours,
           n.oid IS NOT NULL AND has_table_privilege(n.oid, 'INSERT') AND has_table_privilege(n.oid, 'SELECT')
               AS writable,
           n.oid IS NOT NULL AND pg_has_role(n.relowner, 'USAGE') AS owned,
           n.oid IS NOT NULL AND has_table_privilege(n.oid, 'DELETE') AND has_table_privilege(n.oid, 'SELECT')
               AS emptiable,
           %(ttl)s::interval > interval '0'
           AND n.day < to_char((now() - %(ttl)s::interval) AT TIME ZONE 'UTC', 'YYYYMMDD') AS past,
           %(ttl)s::interval > interval '0'
           AND n.day < to_char((now() - %(ttl)s::interval - interval '1 hour') AT TIME ZONE 'UTC', 'YYYYMMDD')
               AS overdue
    FROM named n
) AS t ON true
ORDER BY t.day

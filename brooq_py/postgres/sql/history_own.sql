-- name: history_own
-- SPEC B2, T1: a day's table just made, in the transaction that made it (after history_scope), given
-- to the owner of job, so that every engine running as that role (or as any member of it:
-- per-instance credentials) may drop it, not only the one that made it. Left to its maker when the
-- owner of job may not own a table in this schema (no CREATE on it).
DO $$
DECLARE
    owner name := (SELECT pg_catalog.pg_get_userbyid(c.relowner) FROM pg_catalog.pg_class c
                   WHERE c.oid = pg_catalog.to_regclass({job_literal}));
BEGIN
    IF owner OPERATOR(pg_catalog.<>) current_user THEN
        EXECUTE pg_catalog.format('ALTER TABLE %%s OWNER TO %%I', {history_literal}, owner);
    END IF;
EXCEPTION WHEN insufficient_privilege THEN
    NULL;
END
$$

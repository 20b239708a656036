-- name: job_history_back
-- SPEC B2, Q1: a dead or canceled job that moved to a table of history goes back to the job table
-- before its retry (job_retry.sql then writes it there: a table of history holds ended jobs only).
-- Nothing for a job in the job table, in another state, or unknown.
-- Its functions and operators are named with their schema, pg_catalog: a role with CREATE on a schema
-- of the search_path could otherwise make one that matches better (an <> of oid and regclass) and
-- have it run as the engine's role.
WITH back AS (
    DELETE FROM {job} j
    WHERE j.id = %(id)s AND j.state IN ('dead', 'canceled')
      AND j.tableoid OPERATOR(pg_catalog.<>) pg_catalog.to_regclass({job_literal})::pg_catalog.oid
    RETURNING j AS r
)
-- Its end is now: the mover does not take it back before the retry's UPDATE has had it. SPEC T1:
-- the insert's trigger gives a tenant job a new turn; the one it had is answered beside its id, for
-- the retry to put back (a retried job keeps its turn, docs/tenants.md).
, put AS (
    INSERT INTO {job}
    SELECT (pg_catalog.jsonb_populate_record(b.r, pg_catalog.jsonb_build_object('updated_at', pg_catalog.now()))).*
    FROM back b
    RETURNING id
)
SELECT p.id, (b.r).turn FROM put p JOIN back b ON (b.r).id OPERATOR(pg_catalog.=) p.id

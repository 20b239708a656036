-- name: job_history_back
-- SPEC B2, Q1: a dead or canceled job that moved to a table of history goes back to the job table
-- before its retry (job_retry.sql then writes it there: a table of history holds ended jobs only).
-- Nothing for a job in the job table, in another state, or unknown.
WITH back AS (
    DELETE FROM {job} j
    WHERE j.id = %(id)s AND j.state IN ('dead', 'canceled') AND j.tableoid <> to_regclass({job_literal})
    RETURNING j AS r
)
-- Its end is now: the mover does not take it back before the retry's UPDATE has had it.
INSERT INTO {job}
SELECT (jsonb_populate_record(b.r, jsonb_build_object('updated_at', now()))).*
FROM back b
RETURNING id

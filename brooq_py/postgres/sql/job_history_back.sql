-- name: job_history_back
-- SPEC B2, Q1: a dead or canceled job that moved to a table of history goes back to the job table
-- before its retry (job_retry.sql then writes it there: a table of history holds ended jobs only).
-- Nothing for a job in the job table, in another state, or unknown.
WITH back AS (
    DELETE FROM {job} j
    WHERE j.id = %(id)s AND j.state IN ('dead', 'canceled') AND j.tableoid <> to_regclass({job_literal})
    RETURNING j.*
)
INSERT INTO {job}
SELECT * FROM back
RETURNING id

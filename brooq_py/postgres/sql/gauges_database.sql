-- name: gauges_database
-- SPEC Z2: what keeps VACUUM from cleaning the job table, read by the refresher.
-- oldest_transaction_seconds: the oldest transaction open on this database
-- (another client's session or a prepared transaction); while it is open no
-- row version deleted after it began can be removed, in any table. Without
-- pg_read_all_stats (or pg_monitor) a role sees only its own sessions' times.
-- dead/live tuples: the statistics system's counts for this schema's job table
-- (%(job)s is its qualified name: a schema without the table is an error, not 0);
-- inserted: the rows ever inserted into it (by any process; rolled-back ones too), since
-- the statistics were last reset.
-- Reads shared memory only: no table is scanned.
SELECT coalesce(extract(epoch FROM now() - least(
           (SELECT min(a.xact_start) FROM pg_stat_activity a
            WHERE a.datname = current_database() AND a.backend_type = 'client backend'
              AND a.pid <> pg_backend_pid() AND a.xact_start IS NOT NULL),
           (SELECT min(x.prepared) FROM pg_prepared_xacts x WHERE x.database = current_database())
       ))::float8, 0) AS oldest_transaction_seconds,
       coalesce(s.n_dead_tup, 0) AS job_dead_tuples,
       coalesce(s.n_live_tup, 0) AS job_live_tuples,
       coalesce(s.n_tup_ins, 0) AS job_inserted
FROM (SELECT 1) AS one
LEFT JOIN pg_stat_user_tables s ON s.relid = %(job)s::regclass

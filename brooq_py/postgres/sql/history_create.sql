-- name: history_create
-- SPEC B2: the table of one day of terminal history. It inherits job, so `SELECT … FROM job` reads
-- it (SPEC B3: every job, active or terminal, and a job's fate is one SELECT of job) while the
-- statements of the hot path name the job table alone ({live}: ONLY). Its checks keep any other
-- state out (an UPDATE of job that would make one of its rows active fails instead of leaving it
-- where no claim reads) and any idempotency key (a job with one never moves: the key's lookups read
-- the job table alone), and let a statement that asks for an active state or a key skip it. Its primary key
-- serves reads by id, its index on updated_at the lists of ended jobs, newest first.
-- Every engine may try to make the day's table: one makes it, the others fail (a duplicate table,
-- or a unique violation of the catalog) and find it made. A table of the name found already, made
-- by anyone, is left as it is (history_tables.sql says whether it is a day).
CREATE TABLE {history} (
    CONSTRAINT job_history_terminal CHECK (state IN ('done', 'dead', 'canceled')),
    CONSTRAINT job_history_keyless CHECK (idempotency_key IS NULL),
    PRIMARY KEY (id)
) INHERITS ({job})

-- name: job_sequence_halts
-- SPEC Q5: the dead members that halt a sequence of %(topics)s (a probe of job_sequence_halt's
-- primary key per topic): the stager's sweep of the topics its engine runs with
-- sequence_on_dead="continue" passes them (job_sequence_pass).
SELECT h.job::text FROM {job_sequence_halt} h WHERE h.topic = ANY (%(topics)s::text[])

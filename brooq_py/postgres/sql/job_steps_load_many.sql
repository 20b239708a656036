-- name: job_steps_load_many
-- SPEC DS1, DS4: what a replay needs, for the first durable calls of several runs at once (one
-- statement for the handlers that asked together): each job's recorded steps and signals, by
-- primary-key probes, and one row of the database clock (its id NULL).
SELECT 'step' AS what, s.job_id::text, s.seq, s.name, s.kind, s.result, s.at, now()
FROM {job_step} s WHERE s.job_id = ANY (%(ids)s::uuid[])
UNION ALL
SELECT 'signal', g.job_id::text, NULL, g.name, NULL, g.payload, g.at, now()
FROM {job_signal} g WHERE g.job_id = ANY (%(ids)s::uuid[])
UNION ALL
SELECT 'now', NULL, NULL, NULL, NULL, NULL, NULL, now()

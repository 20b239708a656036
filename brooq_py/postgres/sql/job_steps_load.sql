-- name: job_steps_load
-- SPEC DS1, DS4: what a replay needs, read once, on a handler's first durable call: the
-- job's recorded steps (by their position in a run), the signals sent to it, and the
-- database clock (a sleep's or a wait's end is compared with it). Primary-key probes only.
SELECT 'step' AS what, s.seq, s.name, s.kind, s.result, s.at, now()
FROM {job_step} s WHERE s.job_id = %(id)s
UNION ALL
SELECT 'signal', NULL, g.name, NULL, g.payload, g.at, now()
FROM {job_signal} g WHERE g.job_id = %(id)s
UNION ALL
SELECT 'now', NULL, NULL, NULL, NULL, NULL, now()

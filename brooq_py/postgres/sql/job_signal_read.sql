-- name: job_signal_read
-- SPEC DS4: the signal a waiting handler asks for, if it was sent (its payload and time), with
-- the database clock. A primary-key probe.
SELECT g.payload, g.at, now(), true
FROM {job_signal} g WHERE g.job_id = %(id)s AND g.name = %(name)s
UNION ALL
SELECT NULL, NULL, now(), false

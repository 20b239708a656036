-- name: job_sequence_resume
-- SPEC Q5: release a sequence halted behind a dead member (which stays dead); false
-- when it was not halted. The next member is released now, or owed to the stager when
-- it or the sequence's lock is held elsewhere (migration 0018).
SELECT {job_sequence_resume}(%(topic)s, %(sequence)s, NULL)

-- name: job_sequence_pass
-- SPEC Q5: KindOptions(sequence_on_dead="continue"): the members an engine wrote dead
-- no longer hold their sequences (migration 0018); jobs in no sequence match nothing.
SELECT {job_sequence_resume}(h.topic, h.sequence, h.job)
FROM {job_sequence_halt} h
WHERE h.job = ANY (%(ids)s::uuid[])

-- name: job_sequence_pass
-- SPEC Q5: KindOptions(sequence_on_dead="continue"): the members an engine wrote dead
-- no longer hold their sequences (migration 0018); jobs in no sequence match nothing. The
-- stager's sweep sends those job_sequence_halts found.
-- SPEC F2: as job_sequence_resume, the depth sequence moves past every Store's anchor
-- when a sequence of a capped topic was released (its members count again).
WITH r AS MATERIALIZED (
    SELECT h.topic, {job_sequence_resume}(h.topic, h.sequence, h.job) AS resumed
    FROM {job_sequence_halt} h
    WHERE h.job = ANY (%(ids)s::uuid[])
), capped AS (
    -- every row of r, each resume made, before the one move
    SELECT count(*) FILTER (WHERE r.resumed AND EXISTS (SELECT FROM {topic_setting} s
                                                        WHERE s.topic = r.topic AND s.max_depth IS NOT NULL)) AS n
    FROM r
)
SELECT CASE WHEN c.n > 0
            THEN setval(to_regclass({depth_seq}), nextval(to_regclass({depth_seq})) + 2147483648) END
FROM capped c

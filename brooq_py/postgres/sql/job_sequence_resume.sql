-- name: job_sequence_resume
-- SPEC Q5: release a sequence halted behind a dead member (which stays dead); false
-- when it was not halted. The next member is released now, or owed to the stager when
-- it or the sequence's lock is held elsewhere (migration 0018).
-- SPEC F2: the members behind a halted sequence are not in its topic's depth
-- (depth_waiting.sql); on a capped topic they are again from this commit, so the depth
-- sequence moves past every Store's anchor (as topic_set_depth moves it), after this
-- transaction's id: each Store's next capped enqueue of the topic counts.
WITH r AS MATERIALIZED (
    SELECT {job_sequence_resume}(%(topic)s, %(sequence)s, NULL) AS resumed
)
SELECT r.resumed,
       CASE WHEN r.resumed AND EXISTS (SELECT FROM {topic_setting} s
                                       WHERE s.topic = %(topic)s AND s.max_depth IS NOT NULL)
            THEN setval(to_regclass({depth_seq}), nextval(to_regclass({depth_seq})) + 2147483648) END
FROM r

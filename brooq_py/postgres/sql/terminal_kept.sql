-- name: terminal_kept
-- SPEC D4, Q5: whether retention and the mover leave the ended row j where it is: a parent while a
-- child naming it is active (one probe of job_edge's primary key per row; a child may name a parent
-- that had already ended, which is never written, so the row itself cannot tell), a dead member
-- that halts its sequence (its retry stays possible and its id, named on the next member, readable;
-- a resume lets it go). An active child is always in the job table itself (SPEC B2).
(EXISTS (SELECT FROM {job_edge} e
         WHERE e.parent = j.id
           AND (SELECT c.state FROM {live} c WHERE c.id = e.child) NOT IN ('done', 'dead', 'canceled'))
 OR (j.sequence IS NOT NULL AND j.state = 'dead'
     AND EXISTS (SELECT FROM {job_sequence_halt} h
                 WHERE h.topic = j.topic AND h.sequence = j.sequence AND h.job = j.id)))

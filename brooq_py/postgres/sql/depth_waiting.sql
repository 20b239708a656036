-- name: depth_waiting
-- SPEC F2, F3, Q5: the waiting jobs of the topic dt.topic that count toward its depth cap
-- dt.cap, each count stopping at the cap, as one row (waiting). A statement puts it after a
-- row dt (topic, cap): `FROM (SELECT <topic> AS topic, <cap> AS cap) AS dt,
-- LATERAL ({depth_waiting}) AS d`. Waiting: pending (the claim index), scheduled, failed and
-- blocked (the waiting index), except the members held behind a halted sequence (a dead
-- member with sequence_on_dead="halt"): like the dead member that holds them, they wait for
-- an operator's retry or resume_sequence, not for the engines, and counting them would hold
-- up the topic's other sequences and jobs. They are found from job_sequence_halt (one probe
-- of its primary key when the topic has no halted sequence) through job_sequence_idx, and the
-- waiting index is walked that much further (OFFSET 0: a probe per halted sequence, never a
-- join that could read the topic's other members). Taking them back into the count (a retry, a
-- resume) moves the depth sequence past every Store's anchor (job_retry, job_sequence_resume,
-- job_sequence_pass).
SELECT (SELECT count(*) FROM (SELECT FROM {live} WHERE topic = dt.topic AND state = 'pending'
                              LIMIT dt.cap) AS p)
     + (SELECT count(*) FROM (SELECT FROM {live} WHERE topic = dt.topic
                                  AND state IN ('scheduled', 'failed', 'blocked')
                              LIMIT dt.cap + s.held) AS w)
     - s.held AS waiting
FROM (SELECT count(*) AS held
      FROM (SELECT DISTINCT h.sequence FROM {job_sequence_halt} h WHERE h.topic = dt.topic) AS h
      CROSS JOIN LATERAL (SELECT FROM {live} m
                          WHERE m.topic = dt.topic AND m.sequence = h.sequence AND m.state = 'blocked'
                          OFFSET 0) AS m) AS s

-- name: depth_waiting_0017
-- depth_waiting.sql on a schema before migration 0018 (no sequences, so none halted): the
-- topic's pending, scheduled, failed and blocked jobs, each count stopping at the cap.
SELECT (SELECT count(*) FROM (SELECT FROM {job} WHERE topic = dt.topic AND state = 'pending'
                              LIMIT dt.cap) AS p)
     + (SELECT count(*) FROM (SELECT FROM {job} WHERE topic = dt.topic
                                  AND state IN ('scheduled', 'failed', 'blocked')
                              LIMIT dt.cap) AS w) AS waiting

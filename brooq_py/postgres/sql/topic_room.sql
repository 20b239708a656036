-- name: topic_room
-- SPEC F2 for a group's `then` (enqueue_group): whether %(n)s more waiting jobs of a topic
-- capped at %(cap)s fit, counted as job_enqueue counts (each count stopping at the cap), so
-- that a `then` that would not fit is refused before the group is written, not after it.
SELECT (SELECT count(*) FROM (SELECT FROM {job} WHERE topic = %(topic)s AND state = 'pending'
                              LIMIT %(cap)s) AS p)
     + (SELECT count(*) FROM (SELECT FROM {job} WHERE topic = %(topic)s
                                  AND state IN ('scheduled', 'failed', 'blocked')
                              LIMIT %(cap)s) AS w)
     + %(n)s <= %(cap)s

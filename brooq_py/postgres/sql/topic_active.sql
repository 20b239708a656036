-- name: topic_active
-- Whether a topic has a job waiting or running: probes of the claim, waiting and lease
-- indexes, never a scan of the table (finished jobs are not looked at).
SELECT EXISTS (SELECT 1 FROM {job} WHERE topic = %(topic)s AND state = 'pending')
    OR EXISTS (SELECT 1 FROM {job} WHERE topic = %(topic)s AND state IN ('scheduled', 'failed'))
    OR EXISTS (SELECT 1 FROM {job} WHERE state = 'processing' AND locked_until IS NOT NULL
               AND topic = %(topic)s)

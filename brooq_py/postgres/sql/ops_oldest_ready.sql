-- name: ops_oldest_ready
-- Age of the oldest ready job per topic: the queue's lag.
SELECT topic, now() - min(available_at) AS oldest_ready
FROM {job}
WHERE state = 'pending' AND available_at <= now()
GROUP BY topic
ORDER BY topic

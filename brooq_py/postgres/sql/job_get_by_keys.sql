-- name: job_get_by_keys
-- The jobs holding several (topic, key) pairs at once (enqueue_many's follow-up).
SELECT k.topic, k.key, j.id
FROM unnest(%(topics)b::text[], %(keys)b::text[]) AS k(topic, key)
JOIN {live} j ON j.topic = k.topic AND j.idempotency_key = k.key

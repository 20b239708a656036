-- name: job_enqueue_many
-- A batch in one statement (SPEC E5). Returns one row per input, in input order:
-- the inserted id, else the id of the row already holding (topic, key) as the
-- statement's snapshot sees it (NULL when a concurrent duplicate committed
-- meanwhile: the caller asks again in a new statement). Jobs due later than the
-- statement's time are scheduled (SPEC S5).
WITH input AS (
    SELECT *
    FROM unnest(%(ids)b::uuid[], %(topics)b::text[], %(payloads)b::text[], %(keys)b::text[],
                %(available_at)b::timestamptz[], %(priorities)b::int[])
         WITH ORDINALITY AS u(id, topic, payload, key, available_at, priority, ord)
), inserted AS (
    INSERT INTO {job} (id, topic, payload, idempotency_key, available_at, priority, state)
    SELECT id, topic, payload::jsonb, key, at, priority,
           CASE WHEN at > statement_timestamp() THEN 'scheduled' ELSE 'pending' END
    FROM (SELECT *, coalesce(available_at, statement_timestamp()) AS at FROM input) AS i
    ORDER BY ord
    ON CONFLICT (topic, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id
)
SELECT CASE WHEN ins.id IS NOT NULL THEN ins.id
            WHEN i.key IS NOT NULL THEN (SELECT e.id FROM {job} e WHERE e.topic = i.topic AND e.idempotency_key = i.key)
       END AS id,
       ins.id IS NOT NULL AS created
FROM input i
LEFT JOIN inserted ins ON ins.id = i.id
ORDER BY i.ord

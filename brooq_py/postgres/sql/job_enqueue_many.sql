-- name: job_enqueue_many
-- A batch in one statement (SPEC E5). The caller made every id (SPEC Z4), so a row
-- that inserted needs nothing back: a row comes back only for an input whose
-- (topic, key) was already there, with its position (ord, from 1) and the id of the
-- row holding the key as the statement's snapshot sees it (NULL when a concurrent
-- duplicate committed meanwhile: the caller asks again in a new statement). Jobs
-- due later than the statement's time are scheduled (SPEC S5). Every column comes
-- as one string to bind, not 1,000 values: an array literal (brooq_py.postgres.arrays),
-- the payloads as one JSON array.
WITH input AS (
    SELECT *
    FROM ROWS FROM (unnest(%(ids)s::uuid[]), unnest(%(topics)s::text[]),
                    jsonb_array_elements(%(payloads)s::jsonb), unnest(%(keys)s::text[]),
                    unnest(%(available_at)s::timestamptz[]), unnest(%(priorities)s::int[]))
         WITH ORDINALITY AS u(id, topic, payload, key, available_at, priority, ord)
), inserted AS (
    INSERT INTO {job} (id, topic, payload, idempotency_key, available_at, priority, state)
    SELECT id, topic, payload, key, at, priority,
           CASE WHEN at > statement_timestamp() THEN 'scheduled' ELSE 'pending' END
    FROM (SELECT *, coalesce(available_at, statement_timestamp()) AS at FROM input) AS i
    ORDER BY ord
    ON CONFLICT (topic, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id
)
SELECT i.ord, (SELECT e.id FROM {job} e WHERE e.topic = i.topic AND e.idempotency_key = i.key) AS id
FROM input i
WHERE i.key IS NOT NULL AND NOT EXISTS (SELECT FROM inserted ins WHERE ins.id = i.id)

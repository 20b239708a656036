-- name: job_enqueue_many
-- A batch in one statement (SPEC E5). The caller made every id (SPEC Z4), so a row
-- that inserted needs nothing back: a row comes back only for an input whose
-- (topic, key) was already there, with its position (ord, from 1) and the id of the
-- row holding the key as the statement's snapshot sees it (NULL when a concurrent
-- duplicate committed meanwhile: the caller asks again in a new statement). Jobs
-- due later than the statement's time are scheduled (SPEC S5). Every column comes
-- as one string to bind, not 1,000 values: an array literal (brooq_py.postgres.arrays),
-- the payloads as one JSON array.
-- SPEC F2: %(cap_topics)s/%(caps)s name the batch's depth-capped topics (empty
-- for none: nothing is read) and their caps. A topic's new jobs are those whose
-- key no row holds yet, as the snapshot sees it (a duplicate writes nothing, so
-- it is answered, never refused). When the new jobs of one of them would take it
-- past its cap, nothing is inserted and a row (NULL, NULL, topic) names each such topic;
-- on a parking topic (%(park_topics)s, SPEC F3) the new jobs past the cap, in list order,
-- are written parked instead. The waiting jobs are counted by depth_waiting.sql.
WITH input AS (
    SELECT *
    FROM ROWS FROM (unnest(%(ids)s::uuid[]), unnest(%(topics)s::text[]),
                    jsonb_array_elements(%(payloads)s::jsonb), unnest(%(keys)s::text[]),
                    unnest(%(available_at)s::timestamptz[]), unnest(%(priorities)s::int[]),
                    jsonb_array_elements(%(metas)s::jsonb), unnest(%(sequences)s::text[]),
                    unnest(%(tenants)s::text[]))
         WITH ORDINALITY AS u(id, topic, payload, key, available_at, priority, meta, sequence, tenant, ord)
), fresh AS (
    -- Each new job of a capped topic takes a value of the depth sequence, after the
    -- transaction's id (migration 0014).
    SELECT c.topic, c.cap, c.n,
           (SELECT count(CASE WHEN txid_current() IS NULL THEN NULL ELSE nextval(to_regclass({depth_seq})) END)
            FROM generate_series(1, c.n)) AS taken
    FROM (
        SELECT c.topic, c.cap,
               (SELECT count(*) FROM input i
                WHERE i.topic = c.topic
                  AND NOT EXISTS (SELECT FROM {live} e WHERE e.topic = i.topic AND e.idempotency_key = i.key)) AS n
        FROM unnest(%(cap_topics)s::text[], %(caps)s::int[]) AS c(topic, cap)
    ) AS c
), too_deep AS (
    SELECT c.topic
    FROM fresh c
    WHERE c.taken >= 0 AND c.n > 0 AND c.topic <> ALL (%(park_topics)s::text[])
      AND (SELECT d.waiting FROM (SELECT c.topic, c.cap) AS dt, LATERAL ({depth_waiting}) AS d) + c.n > c.cap
), parking AS (
    -- SPEC F3: how many of a parking topic's new jobs fit under its cap: none while parked
    -- jobs wait (none jumps them), else the room left. Its new jobs take that room in
    -- enqueue order (ord); the ones past it are written parked, never refused.
    SELECT c.topic,
           CASE WHEN EXISTS (SELECT FROM {job} WHERE topic = c.topic AND state = 'parked') THEN 0
                ELSE (SELECT c.cap - d.waiting FROM (SELECT c.topic, c.cap) AS dt, LATERAL ({depth_waiting}) AS d)
           END AS fits
    FROM fresh c
    WHERE c.n > 0 AND c.topic = ANY (%(park_topics)s::text[])
), parked AS (
    SELECT n.ord
    FROM (SELECT i.ord, k.fits, row_number() OVER (PARTITION BY i.topic ORDER BY i.ord) AS turn
          FROM input i
          JOIN parking k ON k.topic = i.topic
          WHERE NOT EXISTS (SELECT FROM {live} e WHERE e.topic = i.topic AND e.idempotency_key = i.key)) AS n
    WHERE n.turn > n.fits
), inserted AS (
    INSERT INTO {job} (id, topic, payload, idempotency_key, meta, available_at, priority, state, sequence{tenant_col})
    SELECT id, topic, payload, key, nullif(meta, 'null'::jsonb), at, priority,
           CASE WHEN ord IN (SELECT p.ord FROM parked p) THEN 'parked'
                WHEN at > statement_timestamp() THEN 'scheduled' ELSE 'pending' END,
           sequence{tenant_input}
    FROM (SELECT *, coalesce(available_at, statement_timestamp()) AS at FROM input) AS i
    WHERE NOT EXISTS (SELECT FROM too_deep)
    -- In key order, not input order: two batches of the same keys never deadlock
    -- (job_enqueue_many_unique.sql).
    ORDER BY topic COLLATE "C", key COLLATE "C", ord
    ON CONFLICT (topic, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id
)
SELECT i.ord, (SELECT e.id FROM {live} e WHERE e.topic = i.topic AND e.idempotency_key = i.key) AS id,
       NULL::text AS too_deep
FROM input i
WHERE i.key IS NOT NULL AND NOT EXISTS (SELECT FROM inserted ins WHERE ins.id = i.id)
  AND NOT EXISTS (SELECT FROM too_deep)
UNION ALL
SELECT NULL, NULL, d.topic FROM too_deep d

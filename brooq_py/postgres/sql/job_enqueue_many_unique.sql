-- name: job_enqueue_many_unique
-- SPEC E5, U1, U2, F2: a batch of which some jobs carry a unique key, in one
-- statement (as job_enqueue_many otherwise). ON CONFLICT without a target takes
-- both unique indexes as arbiters: a job whose idempotency key is taken, or
-- whose unique key an active job holds, inserts nothing and raises nothing.
-- A row comes back for each such input: (ord, the row holding its idempotency
-- key, the active holder of its unique key and that holder's state, NULL), as
-- the statement's snapshot sees them (both NULL: a holder committed meanwhile,
-- ask again). The caller repeats nothing within the batch (each key once).
-- Depth caps as in job_enqueue_many (a new job: neither key held, as the
-- snapshot sees it): (NULL, NULL, NULL, NULL, topic) rows, or parked past a parking cap.
WITH input AS (
    SELECT *
    FROM ROWS FROM (unnest(%(ids)s::uuid[]), unnest(%(topics)s::text[]),
                    jsonb_array_elements(%(payloads)s::jsonb), unnest(%(keys)s::text[]),
                    unnest(%(unique_keys)s::text[]),
                    unnest(%(available_at)s::timestamptz[]), unnest(%(priorities)s::int[]),
                    jsonb_array_elements(%(metas)s::jsonb), unnest(%(sequences)s::text[]),
                    unnest(%(tenants)s::text[]))
         WITH ORDINALITY AS u(id, topic, payload, key, unique_key, available_at, priority, meta, sequence, tenant, ord)
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
                  AND NOT EXISTS (SELECT FROM {live} e WHERE e.topic = i.topic AND e.idempotency_key = i.key)
                  AND NOT EXISTS (SELECT FROM {job} e
                                  WHERE e.topic = i.topic AND e.unique_key = i.unique_key
                                    AND e.state IN ('scheduled', 'pending', 'processing', 'failed', 'blocked'))) AS n
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
          WHERE NOT EXISTS (SELECT FROM {live} e WHERE e.topic = i.topic AND e.idempotency_key = i.key)
            AND NOT EXISTS (SELECT FROM {job} e
                            WHERE e.topic = i.topic AND e.unique_key = i.unique_key
                              AND e.state IN ('scheduled', 'pending', 'processing', 'failed', 'blocked'))) AS n
    WHERE n.turn > n.fits
), inserted AS (
    INSERT INTO {job} (id, topic, payload, idempotency_key, unique_key, meta, available_at, priority, state, sequence{tenant_col})
    SELECT id, topic, payload, key, unique_key, nullif(meta, 'null'::jsonb), at, priority,
           CASE WHEN ord IN (SELECT p.ord FROM parked p) THEN 'parked'
                WHEN at > statement_timestamp() THEN 'scheduled' ELSE 'pending' END,
           sequence{tenant_input}
    FROM (SELECT *, coalesce(available_at, statement_timestamp()) AS at FROM input) AS i
    WHERE NOT EXISTS (SELECT FROM too_deep)
    -- In key order, not input order: a batch that meets a key another one holds uncommitted
    -- waits for it holding only keys that sort before it, so two batches of the same keys in
    -- other orders never deadlock (which would abort the caller's transaction). Unique keys first:
    -- batches of this statement meet on them. A batch of job_enqueue_many (idempotency keys only)
    -- and one of this statement sharing idempotency keys can meet in two orders (PostgreSQL then
    -- aborts one: docs/unique-jobs.md); ordering by idempotency keys first would move that hazard to
    -- two unique batches of the same keys where some jobs also carry an idempotency key.
    ORDER BY topic COLLATE "C", unique_key COLLATE "C", key COLLATE "C", ord
    ON CONFLICT DO NOTHING
    RETURNING id
)
SELECT i.ord,
       (SELECT e.id FROM {live} e WHERE e.topic = i.topic AND e.idempotency_key = i.key) AS key_holder,
       h.id AS holder, h.state AS holder_state, NULL::text AS too_deep
FROM input i
LEFT JOIN LATERAL (
    SELECT e.id, e.state FROM {job} e
    WHERE e.topic = i.topic AND e.unique_key = i.unique_key
      AND e.state IN ('scheduled', 'pending', 'processing', 'failed', 'blocked')
) AS h ON true
WHERE (i.key IS NOT NULL OR i.unique_key IS NOT NULL)
  AND NOT EXISTS (SELECT FROM inserted ins WHERE ins.id = i.id)
  AND NOT EXISTS (SELECT FROM too_deep)
UNION ALL
SELECT NULL, NULL, NULL, NULL, d.topic FROM too_deep d

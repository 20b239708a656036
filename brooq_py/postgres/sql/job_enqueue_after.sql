-- name: job_enqueue_after
-- A batch of jobs of which some name parents (Job.after), in one statement
-- (SPEC D1, E5). As job_enqueue_many, plus the parents: %(parents)s is every
-- distinct parent id of the batch, %(edge_ords)s/%(edge_parents)s one pair per
-- (job's position from 1, parent), %(after)s each job's parents as one jsonb array,
-- %(names)s each job's parent names (an array beside its parents, null entries for a parent
-- without one; null for none) and %(any_end)s whether each job takes its parents' ends
-- whatever their state (a group's finally_: never canceled by a parent's failure, BD2).
-- A parent must be visible to this statement (jobs enqueued earlier in the same
-- transaction are). If one is not, nothing is written and the statement returns
-- (-1, that id): the caller raises InvalidJob with its transaction still usable.
-- SPEC D1': no parent row is written, so a caller's REPEATABLE READ transaction never
-- conflicts with the engine's writes to a running parent; the parents are key-share
-- locked, which no settle or heartbeat waits for, only so that retention cannot delete
-- one before this commit. A job waits for its parents not yet done (blocked,
-- waiting_parents) and gets a job_wait row for each (migration 0016): the parent's end
-- applies it, or, when that end committed unseen by this statement (or this one unseen by
-- it), the stager's sweep does (job_release_due). With all of them done it is pending (or
-- scheduled) at once; a parent already dead or canceled makes it canceled at birth (D3).
-- SPEC F2 as job_enqueue_many: when the new jobs of a capped topic (those whose key no
-- row holds yet) would take it past its cap, nothing is written and a row
-- (NULL, NULL, topic) names each such topic.
WITH input AS (
    SELECT *
    FROM ROWS FROM (unnest(%(ids)s::uuid[]), unnest(%(topics)s::text[]),
                    jsonb_array_elements(%(payloads)s::jsonb), unnest(%(keys)s::text[]),
                    unnest(%(available_at)s::timestamptz[]), unnest(%(priorities)s::int[]),
                    jsonb_array_elements(%(after)s::jsonb), jsonb_array_elements(%(metas)s::jsonb),
                    unnest(%(tenants)s::text[]),
                    jsonb_array_elements(%(names)s::jsonb), unnest(%(any_end)s::boolean[]))
         WITH ORDINALITY AS u(id, topic, payload, key, available_at, priority, after, meta, tenant, names, any_end, ord)
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
    WHERE c.taken >= 0 AND c.n > 0
      AND (SELECT d.waiting FROM (SELECT c.topic, c.cap) AS dt, LATERAL ({depth_waiting}) AS d) + c.n > c.cap
), edge AS (
    SELECT *
    FROM ROWS FROM (unnest(%(edge_ords)s::int[]), unnest(%(edge_parents)s::uuid[])) AS e(ord, parent)
), seen AS (
    SELECT id, state FROM {job} WHERE id = ANY (%(parents)s::uuid[])
), complete AS (
    -- Only when every parent is there: a refused batch leaves its parents untouched.
    SELECT count(*) = cardinality(%(parents)s::uuid[]) AND NOT EXISTS (SELECT FROM too_deep) AS ok FROM seen
), parent AS (
    SELECT j.id, j.state
    FROM {job} j
    WHERE j.id = ANY (ARRAY(SELECT s.id FROM seen s)) AND (SELECT ok FROM complete)
    FOR KEY SHARE
), unknown AS (
    -- The first parent missing from the snapshot, else one deleted before its lock was granted.
    SELECT x.id
    FROM unnest(%(parents)s::uuid[]) WITH ORDINALITY AS x(id, n)
    WHERE NOT EXISTS (SELECT FROM parent p WHERE p.id = x.id)
    ORDER BY EXISTS (SELECT FROM seen s WHERE s.id = x.id), x.n
    LIMIT 1
), verdict AS (
    SELECT e.ord,
           count(*) FILTER (WHERE p.state <> 'done'
                              AND NOT (i.any_end AND p.state IN ('dead', 'canceled'))) AS waiting,
           (array_agg(p.id::text || ' ended ' || p.state ORDER BY p.id)
                FILTER (WHERE p.state IN ('dead', 'canceled') AND NOT i.any_end))[1] AS doomed_by
    FROM edge e
    JOIN parent p ON p.id = e.parent
    JOIN input i ON i.ord = e.ord
    GROUP BY e.ord
), inserted AS (
    INSERT INTO {job} (id, topic, payload, idempotency_key, meta, available_at, priority, state,
                       parents, waiting_parents, last_error, parent_names, parents_any_end{tenant_col})
    SELECT i.id, i.topic, i.payload, i.key, nullif(i.meta, 'null'::jsonb), i.at, i.priority,
           CASE WHEN v.doomed_by IS NOT NULL THEN 'canceled'
                WHEN coalesce(v.waiting, 0) > 0 THEN 'blocked'
                WHEN i.at > statement_timestamp() THEN 'scheduled'
                ELSE 'pending' END,
           CASE WHEN jsonb_array_length(i.after) > 0
                THEN ARRAY(SELECT jsonb_array_elements_text(i.after)::uuid) END,
           CASE WHEN v.doomed_by IS NOT NULL THEN 0 ELSE coalesce(v.waiting, 0) END,
           CASE WHEN v.doomed_by IS NOT NULL THEN 'canceled: parent ' || v.doomed_by END,
           CASE WHEN jsonb_typeof(i.names) = 'array'
                THEN ARRAY(SELECT x.name FROM jsonb_array_elements_text(i.names) WITH ORDINALITY AS x(name, n)
                           ORDER BY x.n) END,
           CASE WHEN i.any_end THEN true END{tenant_input}
    FROM (SELECT *, coalesce(available_at, statement_timestamp()) AS at FROM input) AS i
    LEFT JOIN verdict v ON v.ord = i.ord
    WHERE NOT EXISTS (SELECT FROM unknown) AND NOT EXISTS (SELECT FROM too_deep)
    -- In key order, not input order: two batches of the same keys never deadlock
    -- (job_enqueue_many_unique.sql).
    ORDER BY i.topic COLLATE "C", i.key COLLATE "C", i.ord
    ON CONFLICT (topic, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id
), edges AS (
    INSERT INTO {job_edge} (parent, child)
    SELECT e.parent, i.id
    FROM edge e
    JOIN input i ON i.ord = e.ord
    WHERE i.id IN (SELECT id FROM inserted)
), waits AS (
    -- What the child counts in waiting_parents; a child canceled at birth waits for nothing.
    INSERT INTO {job_wait} (parent, child)
    SELECT e.parent, i.id
    FROM edge e
    JOIN input i ON i.ord = e.ord
    JOIN parent p ON p.id = e.parent
    LEFT JOIN verdict v ON v.ord = e.ord
    WHERE i.id IN (SELECT id FROM inserted) AND p.state <> 'done' AND v.doomed_by IS NULL
      AND NOT (i.any_end AND p.state IN ('dead', 'canceled'))
)
SELECT -1::bigint, u.id, NULL::text AS too_deep FROM unknown u WHERE NOT EXISTS (SELECT FROM too_deep)
UNION ALL
SELECT i.ord, (SELECT e.id FROM {live} e WHERE e.topic = i.topic AND e.idempotency_key = i.key), NULL
FROM input i
WHERE i.key IS NOT NULL AND NOT EXISTS (SELECT FROM inserted ins WHERE ins.id = i.id)
  AND NOT EXISTS (SELECT FROM unknown) AND NOT EXISTS (SELECT FROM too_deep)
UNION ALL
SELECT NULL, NULL, d.topic FROM too_deep d

-- name: tenant_set_limit
-- SPEC T2: at most %(limit)s processing jobs per tenant of the topic (NULL: none). Without a
-- tenant, the default of every tenant (in the topic's row); a named tenant's own value (its row)
-- overrides it, and NULL there returns it to the default. A default marks the topic a tenant
-- topic (as its first job naming a tenant does): the jobs that name none are one shared tenant
-- (T1), held to it even where no job names one. The claim counts in its own snapshot
-- under the topic's lock (job_claim_fair), so a limit holds from the next claim; a raised one
-- wakes the topic's engines.
WITH topic_default AS (
    INSERT INTO {topic_setting} AS s (topic, tenant_limit)
    SELECT %(topic)s, %(limit)s::int WHERE %(tenant)s::text IS NULL
    ON CONFLICT (topic) DO UPDATE
    SET tenant_limit = excluded.tenant_limit, updated_at = now()
    RETURNING topic
), mark AS (
    INSERT INTO {tenant_topic} (topic)
    SELECT %(topic)s WHERE %(tenant)s::text IS NULL AND %(limit)s::int IS NOT NULL
    ON CONFLICT (topic) DO NOTHING
), own AS (
    INSERT INTO {tenant_setting} AS t (topic, tenant, concurrency_limit)
    SELECT %(topic)s, %(tenant)s::text, %(limit)s::int WHERE %(tenant)s::text IS NOT NULL
    ON CONFLICT (topic, tenant) DO UPDATE SET concurrency_limit = excluded.concurrency_limit, updated_at = now()
    RETURNING topic
)
SELECT topic, pg_notify({channel_literal}, topic) FROM (SELECT topic FROM topic_default UNION ALL SELECT topic FROM own) AS f

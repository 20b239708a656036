-- name: tenant_set_rate
-- SPEC T3: a token bucket per tenant of the topic, %(limit)s tokens per %(per)s seconds, at most
-- %(burst)s saved (NULL limit: none). Without a tenant, the default of every tenant (in the topic's
-- row); a named tenant's own (its row) overrides it. The buckets themselves are tenant_setting rows
-- the claim writes for the tenants it took jobs of (a bucket never written starts full); a changed
-- rate keeps what a bucket holds, at most the new burst. A default marks the topic a tenant topic,
-- as tenant_set_limit's does (the jobs that name no tenant share one bucket).
WITH topic_default AS (
    INSERT INTO {topic_setting} AS s (topic, tenant_rate_limit, tenant_rate_per, tenant_rate_burst)
    SELECT %(topic)s, %(limit)s::int, %(per)s::float8, %(burst)s::int
    WHERE %(tenant)s::text IS NULL
    ON CONFLICT (topic) DO UPDATE SET
        tenant_rate_limit = excluded.tenant_rate_limit,
        tenant_rate_per = excluded.tenant_rate_per,
        tenant_rate_burst = excluded.tenant_rate_burst,
        updated_at = now()
    RETURNING topic
), mark AS (
    INSERT INTO {tenant_topic} (topic)
    SELECT %(topic)s WHERE %(tenant)s::text IS NULL AND %(limit)s::int IS NOT NULL
    ON CONFLICT (topic) DO NOTHING
), own AS (
    INSERT INTO {tenant_setting} AS t (topic, tenant, rate_limit, rate_per, rate_burst)
    SELECT %(topic)s, %(tenant)s::text, %(limit)s::int, %(per)s::float8, %(burst)s::int
    WHERE %(tenant)s::text IS NOT NULL
    ON CONFLICT (topic, tenant) DO UPDATE SET
        rate_limit = excluded.rate_limit,
        rate_per = excluded.rate_per,
        rate_burst = excluded.rate_burst,
        updated_at = now()
    RETURNING topic
)
SELECT topic, pg_notify({channel_literal}, topic) FROM (SELECT topic FROM topic_default UNION ALL SELECT topic FROM own) AS f

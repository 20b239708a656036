-- name: tenant_set_weight
-- SPEC T1: the tenant's share of the topic's claims while it is backlogged (NULL: the default, 1).
-- It spaces the turns given to the tenant's jobs enqueued from now on (migration 0019's trigger).
INSERT INTO {tenant_setting} AS t (topic, tenant, weight)
VALUES (%(topic)s, %(tenant)s, %(weight)s::int)
ON CONFLICT (topic, tenant) DO UPDATE SET weight = excluded.weight, updated_at = now()

-- name: job_enqueue_unique_new
-- SPEC U1: the first attempt of a Store's own enqueue (autocommit) of a job with
-- a unique key, on_duplicate 'keep', no idempotency key, parents or depth cap:
-- the plain insert with the partial unique index job_unique_idx as its only
-- arbiter, so that a duplicate inserts nothing and raises nothing. Nothing
-- comes back: the command's row count says whether it inserted (the id is the
-- caller's). Not inserted: the caller runs job_enqueue_unique, which answers
-- with the holder (or inserts, if the holder ended meanwhile).
INSERT INTO {job} (id, topic, payload, unique_key, meta, priority, available_at, state{tenant_col})
VALUES (%(id)s, %(topic)s, %(payload)s::jsonb, %(unique_key)s, %(meta)s::jsonb, %(priority)s,
        coalesce(%(available_at)s::timestamptz, statement_timestamp()),
        CASE WHEN %(available_at)s::timestamptz > statement_timestamp() THEN 'scheduled' ELSE 'pending' END{tenant_param})
ON CONFLICT (topic, unique_key)
    WHERE unique_key IS NOT NULL AND state IN ('scheduled', 'pending', 'processing', 'failed', 'blocked')
DO NOTHING

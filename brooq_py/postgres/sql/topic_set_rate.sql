-- name: topic_set_rate
-- SPEC F1: the topic's token bucket (NULL limit: none). A new bucket starts
-- full (burst tokens); a changed one keeps what it had refilled by the old
-- rate until now, at most the new burst. By the database clock, as the claim.
-- Returns whether the topic had no limit of either kind before (a new row or
-- neither limit), read from the statement's snapshot; and wakes its engines.
INSERT INTO {topic_setting} AS s (topic, rate_limit, rate_per, rate_burst, rate_tokens, rate_at)
VALUES (%(topic)s, %(limit)s::int, %(per)s::float8, %(burst)s::int, %(burst)s::float8,
        CASE WHEN %(limit)s::int IS NOT NULL THEN clock_timestamp() END)
ON CONFLICT (topic) DO UPDATE SET
    rate_limit = excluded.rate_limit,
    rate_per = excluded.rate_per,
    rate_burst = excluded.rate_burst,
    rate_tokens = CASE
        WHEN excluded.rate_limit IS NULL THEN NULL
        WHEN s.rate_limit IS NULL THEN excluded.rate_burst
        ELSE least(excluded.rate_burst::float8,
                   s.rate_tokens + greatest(0, extract(epoch FROM clock_timestamp() - s.rate_at))::float8
                                   * s.rate_limit / s.rate_per)
        END,
    rate_at = CASE WHEN excluded.rate_limit IS NULL THEN NULL
                   ELSE greatest(s.rate_at, clock_timestamp()) END,
    updated_at = now()
RETURNING coalesce((SELECT o.concurrency_limit IS NULL AND o.rate_limit IS NULL
                    FROM {topic_setting} o WHERE o.topic = s.topic), true) AS newly,
          pg_notify({channel_literal}, CASE WHEN octet_length(s.topic) < 8000 THEN s.topic ELSE '' END)::text

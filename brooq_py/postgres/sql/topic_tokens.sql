-- name: topic_tokens
-- SPEC F1: a topic's token bucket refilled from the database clock (c.t): rate_limit tokens per
-- rate_per seconds since rate_at, at most rate_burst; NULL without a rate limit ({topic_tokens}
-- in job_claim_limited and job_claim_fair, over the topic's setting row s).
CASE WHEN s.rate_limit IS NOT NULL THEN
    least(s.rate_burst::float8,
          coalesce(s.rate_tokens, s.rate_burst)
          + greatest(0, extract(epoch FROM c.t - coalesce(s.rate_at, c.t)))::float8
            * s.rate_limit / s.rate_per)
END

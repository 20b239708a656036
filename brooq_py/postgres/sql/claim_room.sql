-- name: claim_room
-- SPEC Q3, F1: the claim's room under a topic's global and rate limits, shared by job_claim_limited
-- and job_claim_fair ({claim_room} in them): the CTE setting (s, with the bucket's tokens as
-- topic_tokens computes them) and room (n: at most %(limit)s, the limit less the topic's
-- processing rows, floor(tokens)).
room AS (
    SELECT greatest(0, least(
        %(limit)s,
        CASE WHEN s.concurrency_limit IS NULL THEN %(limit)s
             ELSE s.concurrency_limit - (
                 SELECT count(*) FROM {live} p WHERE p.state = 'processing' AND p.topic = s.topic)
        END,
        CASE WHEN s.rate_limit IS NULL THEN %(limit)s ELSE floor(s.tokens)::bigint END
    )) AS n
    FROM setting s
)

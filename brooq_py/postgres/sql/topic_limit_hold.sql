-- name: topic_limit_hold
-- SPEC Q3: set_limit holds the topic's claim lock (topic_claim_lock's key) for its session while
-- a new limit takes effect, so no claim on the limited path counts before the claims that did
-- not see the limit have committed. A try: the caller retries until its deadline.
SELECT pg_try_advisory_lock(hashtextextended({channel_literal} || ':' || %(topic)s, 0))

-- name: topic_limit_unhold
-- SPEC Q3: let go of the hold topic_limit_hold took.
SELECT pg_advisory_unlock(hashtextextended({channel_literal} || ':' || %(topic)s, 0))

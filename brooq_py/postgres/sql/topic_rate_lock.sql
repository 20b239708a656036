-- name: topic_rate_lock
-- SPEC F1: a rate change waits for the claim of its topic that holds the lock
-- of topic_claim_lock (the same key), so no claim spends tokens of a bucket
-- being changed; the lock ends with the transaction.
SELECT pg_advisory_xact_lock(hashtextextended({channel_literal} || ':' || %(topic)s, 0))::text

-- name: topic_claim_lock
-- SPEC Q3: claims of a globally limited topic take turns, one transaction at a
-- time per topic and schema; the lock ends with the transaction.
SELECT pg_advisory_xact_lock(hashtextextended({channel_literal} || ':' || %(topic)s, 0))

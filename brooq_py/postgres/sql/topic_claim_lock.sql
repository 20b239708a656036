-- name: topic_claim_lock
-- SPEC Q3: claims of a globally limited topic take turns, one transaction at a
-- time per topic and schema; the lock ends with the transaction. A try: a claim
-- that finds it taken (another engine claiming, or a session holding it) takes
-- nothing this time rather than wait, so the dispatcher never blocks on it.
SELECT pg_try_advisory_xact_lock(hashtextextended({channel_literal} || ':' || %(topic)s, 0))

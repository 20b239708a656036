-- name: topic_claim_lock
-- SPEC Q3: claims of a globally limited topic take turns, one transaction at a
-- time per topic and schema; the lock ends with the transaction. A try: a claim
-- that finds it taken (another engine claiming, or a session holding it) takes
-- nothing this time rather than wait, so the dispatcher never blocks on it.
-- SPEC L3': the claim that follows waits at most %(lock_timeout)s for a row lock (the topic's
-- settings row, which a caller's transaction holds from its topic's first job naming a tenant
-- until it commits) and runs at most %(statement_timeout)s: set_config(..., true) is SET LOCAL.
SELECT pg_try_advisory_xact_lock(hashtextextended({channel_literal} || ':' || %(topic)s, 0)),
       set_config('lock_timeout', %(lock_timeout)s, true),
       set_config('statement_timeout', %(statement_timeout)s, true)

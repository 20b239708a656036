-- name: topic_claim_lock_fair
-- topic_claim_lock for job_claim_fair (SPEC T1-T3), which also has the claim that follows in the
-- same transaction use its cached generic plan: planned afresh, that statement costs several
-- times its run. set_config(..., true) holds until the transaction ends, as SET LOCAL. Its waits
-- are bounded as topic_claim_lock's.
SELECT pg_try_advisory_xact_lock(hashtextextended({channel_literal} || ':' || %(topic)s, 0)),
       set_config('plan_cache_mode', 'force_generic_plan', true),
       set_config('lock_timeout', %(lock_timeout)s, true),
       set_config('statement_timeout', %(statement_timeout)s, true)

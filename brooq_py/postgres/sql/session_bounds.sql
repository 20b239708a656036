-- name: session_bounds
-- SPEC L3': bound the waits of the statement that follows in this transaction (a claim or
-- an outcome batch that fell back to the pool): set_config(..., true) is SET LOCAL.
SELECT set_config('lock_timeout', %(lock_timeout)s, true), set_config('statement_timeout', %(statement_timeout)s, true)

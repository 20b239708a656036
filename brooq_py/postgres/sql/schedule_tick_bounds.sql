-- name: schedule_tick_bounds
-- SPEC Q4': a tick's transaction holds the schedule's row from its advance to its commit, two
-- round trips apart on the caller's pool, whose sessions set no bound: a process stopped in
-- between (SIGSTOP, a frozen VM, a debugger) held every other engine's tick of that schedule for as
-- long as it stayed stopped. This transaction's waits and idle time are bounded (set_config(...,
-- true) is SET LOCAL): the server ends its session once idle in it for %(idle)s, which lets the
-- row go, and an advance waits at most %(lock)s for the row held by another, whose scheduler
-- tries again after its retry delay.
SELECT set_config('lock_timeout', %(lock)s, true),
       set_config('statement_timeout', %(statement)s, true),
       set_config('idle_in_transaction_session_timeout', %(idle)s, true)

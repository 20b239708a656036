-- name: signal_savepoint_rollback
-- SPEC DS4: the signal's statement failed; the caller's transaction goes back to where the
-- signal started, usable, as if it had not been sent.
ROLLBACK TO SAVEPOINT brooq_signal

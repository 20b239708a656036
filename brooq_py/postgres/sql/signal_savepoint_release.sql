-- name: signal_savepoint_release
-- SPEC DS4: the signal's statement ran; its savepoint is released (its write stays with the
-- caller's transaction).
RELEASE SAVEPOINT brooq_signal

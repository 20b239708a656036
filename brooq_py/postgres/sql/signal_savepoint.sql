-- name: signal_savepoint
-- SPEC DS4: store.signal in a caller's transaction marks where it starts, so that a signal
-- of the same name committed after that transaction's snapshot (a REPEATABLE READ or
-- SERIALIZABLE transaction's insert then fails: 40001) undoes this signal only.
SAVEPOINT brooq_signal

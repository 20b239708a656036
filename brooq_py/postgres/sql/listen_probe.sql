-- name: listen_probe
-- Sent from a second connection right after LISTEN: if it never arrives, LISTEN
-- is dead on that connection (a transaction-pooling proxy) and the engine polls.
SELECT pg_notify({channel_literal}, %(payload)s)

-- name: history_index
-- SPEC B2: the index of a day's table of history for the lists of ended jobs (newest first).
CREATE INDEX IF NOT EXISTS {history_index} ON {history} (updated_at)

-- name: history_drop
-- SPEC B2, T1: a day of terminal history goes whole, without a dead row version per job.
DROP TABLE {history}

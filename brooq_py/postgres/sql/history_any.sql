-- name: history_any
-- SPEC T1: whether a day's table holds a row: a day this role empties (it may not drop it) is
-- locked and emptied only while it does.
SELECT EXISTS (SELECT FROM ONLY {history})

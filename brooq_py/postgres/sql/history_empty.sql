-- name: history_empty
-- SPEC T1, B2: a day of terminal history past the ttl that this role may not drop (its owner made
-- it: engines that ran as the owner of job, before the switch to a role with DML grants) loses its
-- rows one by one instead, as retention deletes them from job; the empty table stays until its
-- owner drops it. Run where history_drop would be, after history_keep and history_forget.
DELETE FROM ONLY {history}

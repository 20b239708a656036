-- name: job_is_live
-- SPEC B2: whether the job table itself holds the job (a primary-key probe of it alone, which no
-- lock on a table of history holds up): a retry refused there looks no further.
SELECT EXISTS (SELECT FROM {live} WHERE id = %(id)s)

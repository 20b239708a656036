-- name: history_scope
-- SPEC B2: the first statement of every transaction of the mover and the drop, which the engine may
-- run as the owner of job: its functions and operators are pg_catalog's alone until the transaction
-- ends, whatever schema of the search_path another role may create in (one that could define an
-- operator or a function matching better than pg_catalog's would otherwise have it run as this
-- role). The statements name their tables with their schema.
SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true)

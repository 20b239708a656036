-- name: schema_version
-- The migration revision of the schema (the engine refuses to start on a missing or older one).
SELECT version_num FROM {version_table}

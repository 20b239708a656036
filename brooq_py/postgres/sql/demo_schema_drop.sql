-- name: demo_schema_drop
-- The demo resets its own schema (never public) before it starts.
DROP SCHEMA IF EXISTS {schema} CASCADE

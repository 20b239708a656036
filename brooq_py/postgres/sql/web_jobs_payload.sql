-- name: web_jobs_payload
-- The dashboard's payload search: which of %(ids)s hold a payload that contains
-- %(contains)s (jsonb @>). The ids are a window the listing statements (web_jobs_*)
-- read in their index order, a thousand at most: one primary key probe each (the
-- LATERAL ... LIMIT 1 keeps it a probe whatever the planner thinks of the table),
-- so the cost follows the window, never the table, and no GIN index is needed.
SELECT m.id
FROM unnest(%(ids)s::uuid[]) AS x(id)
CROSS JOIN LATERAL (SELECT j.id::text AS id
                    FROM {job} j
                    WHERE j.id = x.id AND j.payload @> %(contains)s::jsonb
                    LIMIT 1) AS m

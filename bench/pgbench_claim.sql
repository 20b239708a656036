-- The one-commit-per-job ceiling (see bench/baselines.py): claim the first ready row with
-- FOR UPDATE SKIP LOCKED and mark it done, in one autocommit statement. The table is found
-- through search_path (PGOPTIONS), so this script names no schema.
UPDATE pgbench_claim
SET state = 'done', updated_at = now()
WHERE id = (
    SELECT id
    FROM pgbench_claim
    WHERE state = 'pending'
    ORDER BY id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
);

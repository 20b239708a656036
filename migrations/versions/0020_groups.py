"""0020 groups: named parents and a fan-in that runs whatever its parents' ends (SPEC BD2, BD3).

- ``job.parent_names text[]``: beside ``parents``, the name each parent was given
  in ``enqueue_group({name: Job})`` (NULL for a parent named only by id; the
  column NULL for a job whose parents bear no names, which is every row written
  before this revision, by psql, or by a producer of the previous release).
- ``job.parents_any_end boolean``: true for a group's ``finally_`` job. Its
  parents' ends release it whatever their state (done, dead or canceled); a
  failed parent never cancels it. NULL or false: a parent that ends dead or
  canceled cancels the job, as before (SPEC D3).

The trigger function ``job_parent_ended`` (0016) learns the second: a parent's
dead or canceled end releases the children that take any end, as a done does,
and dooms only the others (and, transitively, their blocked descendants; the
walk does not pass through a child that takes any end). The stager's sweep
(``job_release_due``) and the retry (``job_retry``) read the same column.

Both columns are nullable without a default: adding them rewrites no row, and
the seed's psql INSERT and every older producer keep working.

The downgrade puts 0016's function back and drops both columns: a ``finally_``
job still blocked then is canceled by a parent that fails, as any fan-in is.
"""

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def _load(name: str) -> ModuleType:
    """A previous revision's module (its file name is no importable module name)."""
    path = Path(__file__).with_name(name)
    spec = importlib.util.spec_from_file_location("brooq_migration_" + name[:4], path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_channel = _load("0013_workflow_release_by_edges.py")._channel

# As 0016's function, with the release applied for a done parent to every child, and for a
# dead or canceled one to the children that take any end (parents_any_end); the doom
# walks only the others.
_FUNCTION = f"""
CREATE OR REPLACE FUNCTION job_parent_ended() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT SET jit = off AS $$
DECLARE
    woken integer;
    -- The moment of the release, not the transaction's start (0013).
    released_at timestamptz := clock_timestamp();
    failed boolean := NEW.state <> 'done';
BEGIN
    -- Most jobs are no one's parent: one probe of the key, nothing more.
    IF NOT EXISTS (SELECT FROM job_wait w WHERE w.parent = NEW.id) THEN
        RETURN NULL;
    END IF;
    WITH mine AS (
        -- A row a sweep holds is the sweep's to apply.
        SELECT w.child FROM job_wait w WHERE w.parent = NEW.id FOR UPDATE SKIP LOCKED
    ), free AS (
        -- A child locked elsewhere keeps its job_wait row for the stager's sweep.
        SELECT c.id
        FROM job c, (SELECT 'blocked'::text AS blocked OFFSET 0) AS g
        WHERE c.id = ANY (ARRAY(SELECT m.child FROM mine m)) AND c.state = g.blocked
          AND (NOT failed OR c.parents_any_end)
        FOR UPDATE OF c SKIP LOCKED
    ), released AS (
        UPDATE job c
        SET waiting_parents = c.waiting_parents - 1,
            state = CASE WHEN c.waiting_parents > 1 THEN 'blocked'
                         WHEN c.available_at > released_at THEN 'scheduled'
                         ELSE 'pending' END,
            available_at = CASE WHEN c.waiting_parents > 1 THEN c.available_at
                                ELSE greatest(c.available_at, released_at) END,
            updated_at = CASE WHEN c.waiting_parents > 1 THEN c.updated_at ELSE now() END
        FROM free f
        WHERE c.id = f.id
        RETURNING c.id, c.topic, c.state
    ), applied AS (
        -- Applied here, or nothing left to apply (the child ended or is gone); a failed
        -- parent's other children are the doom's below.
        DELETE FROM job_wait w
        WHERE w.parent = NEW.id AND w.child = ANY (ARRAY(SELECT m.child FROM mine m))
          AND (w.child = ANY (ARRAY(SELECT r.id FROM released r))
               OR NOT EXISTS (SELECT FROM job c WHERE c.id = w.child AND c.state = 'blocked'))
    )
    SELECT count(pg_notify(
               CASE WHEN d.state = 'scheduled' THEN {_channel("brooq_stage.")} ELSE {_channel("brooq.")} END,
               CASE WHEN octet_length(d.topic) < 8000 THEN d.topic ELSE '' END))
    INTO woken
    FROM (SELECT DISTINCT r.topic, r.state FROM released r WHERE r.state <> 'blocked') AS d;
    IF failed THEN
        -- Every blocked descendant that does not take any end, named after this parent;
        -- each canceled one's own trigger then applies the job_wait rows it was a parent in.
        WITH RECURSIVE doomed(id) AS (
            SELECT w.child FROM job_wait w
            WHERE w.parent = NEW.id
              AND (SELECT c.parents_any_end FROM job c WHERE c.id = w.child) IS NOT TRUE
            UNION
            SELECT w.child
            FROM doomed d
            JOIN job_wait w ON w.parent = d.id
            WHERE (SELECT c.state FROM job c WHERE c.id = d.id) = 'blocked'
              AND (SELECT c.parents_any_end FROM job c WHERE c.id = w.child) IS NOT TRUE
        ), mine AS (
            SELECT w.child FROM job_wait w WHERE w.parent = NEW.id FOR UPDATE SKIP LOCKED
        ), free AS (
            SELECT j.id
            FROM job j, (SELECT 'blocked'::text AS blocked OFFSET 0) AS g
            WHERE j.id = ANY (ARRAY(SELECT d.id FROM doomed d)) AND j.state = g.blocked
            FOR UPDATE OF j SKIP LOCKED
        ), canceled AS (
            UPDATE job j
            SET state = 'canceled',
                last_error = format('canceled: parent %s ended %s', NEW.id, NEW.state),
                updated_at = now()
            FROM free f
            WHERE j.id = f.id
            RETURNING j.id
        )
        DELETE FROM job_wait w
        WHERE w.parent = NEW.id AND w.child = ANY (ARRAY(SELECT m.child FROM mine m))
          AND (w.child = ANY (ARRAY(SELECT c.id FROM canceled c))
               OR NOT EXISTS (SELECT FROM job c WHERE c.id = w.child AND c.state = 'blocked'));
    END IF;
    RETURN NULL;
END $$"""


def upgrade() -> None:
    op.execute("ALTER TABLE job ADD COLUMN parent_names text[], ADD COLUMN parents_any_end boolean")
    op.execute(_FUNCTION)


def downgrade() -> None:
    op.execute(_load("0016_release_without_waiting.py")._FUNCTION)
    op.execute("ALTER TABLE job DROP COLUMN parent_names, DROP COLUMN parents_any_end")

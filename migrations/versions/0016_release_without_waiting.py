"""0016 workflows: a parent's end waits on no other row, and a child's enqueue writes no parent (SPEC O4, D1', D2, D3).

Until now the statement that enqueued a child updated each parent not yet ended
(``has_children``), so that the parent's settle waited for the enqueue's commit;
and the parent's end updated its children, waiting for any of them locked
elsewhere. The first aborted a caller's REPEATABLE READ transaction whenever the
engine rewrote a running parent's row (its heartbeat); the second held every
outcome batched with the parent behind an operator's lock on one child.

- ``job_wait (parent, child)``: one row per dependency whose parent's end the
  child still counts in ``waiting_parents`` (an edge not yet applied). The
  enqueue writes it for each parent that had not ended in its snapshot; it is
  deleted in the transaction that applies the parent's end to the child. Its
  primary key, led by the parent, is what a parent's end reads (O(children)).
  Existing blocked children get theirs from ``job_edge`` here.
- The trigger ``job_parent_ended`` now fires for every job reaching done, dead
  or canceled (no parent row is marked any more); a job that is no one's parent
  costs one probe of ``job_wait``'s key. Its function locks its children with
  ``SKIP LOCKED``: a child held elsewhere (an operator, another parent's end of
  a fan-in) is left with its ``job_wait`` row, never waited for.
- A ``job_wait`` row whose parent has ended is owed: the statement
  ``job_release_due`` (brooq_py/postgres/sql), which every engine's stager runs
  each tick, applies it once the child's lock is gone. It also catches a child
  whose enqueue overlapped its parent's end (the enqueue saw the parent
  running; the end's trigger could not see the uncommitted child).

``has_children`` stays so that producers of the previous release keep working
during a rolling upgrade: their enqueue still sets it on each parent not ended,
holding that parent's row, and the row trigger ``job_children_marked`` (fired
only by that update) gives their blocked children the ``job_wait`` rows they
lack. A later migration may drop both. The downgrade sets it on every parent a
``job_wait`` row names and puts 0013's trigger back.
"""

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def _previous() -> ModuleType:
    """0013's module (its file name is no importable module name)."""
    path = Path(__file__).with_name("0013_workflow_release_by_edges.py")
    spec = importlib.util.spec_from_file_location("brooq_migration_0013", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_channel = _previous()._channel  # the wake-up channel of the trigger's schema, as 0012 names it

# search_path FROM CURRENT: the schema the migration runs in (env.py sets it), so the
# function's statements name that schema's tables whatever the session's search_path.
# The children are found by primary key and their state compared with a fenced column
# (0013: the planner must not read them through the waiting index).
_FUNCTION = f"""
CREATE OR REPLACE FUNCTION job_parent_ended() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT SET jit = off AS $$
DECLARE
    woken integer;
    -- The moment of the release, not the transaction's start (0013).
    released_at timestamptz := clock_timestamp();
BEGIN
    -- Most jobs are no one's parent: one probe of the key, nothing more.
    IF NOT EXISTS (SELECT FROM job_wait w WHERE w.parent = NEW.id) THEN
        RETURN NULL;
    END IF;
    IF NEW.state = 'done' THEN
        WITH mine AS (
            -- A row a sweep holds is the sweep's to apply.
            SELECT w.child FROM job_wait w WHERE w.parent = NEW.id FOR UPDATE SKIP LOCKED
        ), free AS (
            -- A child locked elsewhere keeps its job_wait row for the stager's sweep.
            SELECT c.id
            FROM job c, (SELECT 'blocked'::text AS blocked OFFSET 0) AS g
            WHERE c.id = ANY (ARRAY(SELECT m.child FROM mine m)) AND c.state = g.blocked
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
            -- Applied here, or nothing left to apply (the child ended or is gone).
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
    ELSE
        -- Every blocked descendant, named after this parent; each canceled one's own
        -- trigger then drops the job_wait rows it was a parent in.
        WITH RECURSIVE doomed(id) AS (
            SELECT w.child FROM job_wait w WHERE w.parent = NEW.id
            UNION
            SELECT w.child
            FROM doomed d
            JOIN job_wait w ON w.parent = d.id
            WHERE (SELECT c.state FROM job c WHERE c.id = d.id) = 'blocked'
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

# Only the previous release's enqueue sets has_children; it holds the parent's row, so the
# parent's end comes after its commit and finds these rows.
_MARKED = """
CREATE FUNCTION job_children_marked() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO job_wait (parent, child)
    SELECT e.parent, e.child
    FROM job_edge e
    JOIN job c ON c.id = e.child AND c.state = 'blocked'
    WHERE e.parent = NEW.id
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END $$"""

_WHEN_0012 = (
    "NEW.has_children AND NEW.state IN ('done', 'dead', 'canceled') AND OLD.state IS DISTINCT FROM NEW.state"
)
_WHEN = "NEW.state IN ('done', 'dead', 'canceled') AND OLD.state IS DISTINCT FROM NEW.state"


def _trigger(when: str) -> str:
    return (
        f"CREATE TRIGGER job_parent_ended AFTER UPDATE OF state ON job FOR EACH ROW WHEN ({when}) "
        "EXECUTE FUNCTION job_parent_ended()"
    )


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE job_wait (
            parent uuid NOT NULL,
            child  uuid NOT NULL,
            PRIMARY KEY (parent, child)
        )
        """
    )
    # The sweep reads the whole table each tick: it holds only dependencies not yet applied.
    op.execute(
        "ALTER TABLE job_wait SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 100)"
    )
    op.execute(
        """
        INSERT INTO job_wait (parent, child)
        SELECT e.parent, e.child
        FROM job_edge e
        JOIN job c ON c.id = e.child AND c.state = 'blocked'
        JOIN job p ON p.id = e.parent AND p.state <> 'done'
        """
    )
    op.execute("DROP TRIGGER job_parent_ended ON job")
    op.execute(_FUNCTION)
    op.execute(_trigger(_WHEN))
    op.execute(_MARKED)
    op.execute(
        "CREATE TRIGGER job_children_marked AFTER UPDATE OF has_children ON job FOR EACH ROW "
        "WHEN (NEW.has_children) EXECUTE FUNCTION job_children_marked()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER job_children_marked ON job")
    op.execute("DROP FUNCTION job_children_marked()")
    op.execute("DROP TRIGGER job_parent_ended ON job")
    op.execute(_previous()._FUNCTION)
    op.execute(_trigger(_WHEN_0012))
    # 0013's trigger fires only for a marked parent: mark each one a child still waits for.
    op.execute(
        "UPDATE job SET has_children = true WHERE id IN (SELECT parent FROM job_wait) AND NOT has_children"
    )
    op.execute("DROP TABLE job_wait")

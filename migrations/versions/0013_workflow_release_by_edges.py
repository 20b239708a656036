"""0013 workflows: a parent's end finds its children by its own edges, at the moment of release (SPEC D2, D3).

Replaces the function of 0012's trigger ``job_parent_ended`` (same trigger, same
answers), for two faults found in it:

- How it finds the rows it changes, whatever the statistics say (a table just
  filled with a workflow has none): the children by primary key from the
  parent's own edges (``id = ANY (ARRAY(...))``), the state compared with a
  column of a fenced subquery rather than the literal 'blocked', so that the
  planner cannot read them through the waiting index instead, which holds every
  blocked job of every topic (each parent's end then cost O(blocked jobs): a
  fan-out of 16,000 took 51 s to settle). The recursion reads a descendant's
  state by primary key. ``jit = off``: the planner's estimates for the recursive
  statement can pass the JIT threshold, and compiling it cost 20-30 ms for each
  canceled child that has children of its own (its trigger runs too).
- A child released by a parent's done is due from the moment of the release
  (``clock_timestamp()``), not from the start of the releasing transaction
  (``now()``): a child enqueued in that transaction before its parent's done
  is pending, not scheduled ahead.

The downgrade puts 0012's function back.
"""

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def _channel(prefix: str) -> str:
    return f"""CASE WHEN octet_length('{prefix}' || TG_TABLE_SCHEMA) <= 63
                    THEN '{prefix}' || TG_TABLE_SCHEMA ELSE '{prefix}' || md5(TG_TABLE_SCHEMA) END"""


# search_path FROM CURRENT: the schema the migration runs in (env.py sets it), so the
# function's statements name that schema's tables whatever the session's search_path.
_FUNCTION = f"""
CREATE OR REPLACE FUNCTION job_parent_ended() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT SET jit = off AS $$
DECLARE
    woken integer;
    -- The moment of the release, not the transaction's start (now()): a child enqueued after
    -- the releasing transaction began (in it, before its parent's done) is due, not ahead.
    released_at timestamptz := clock_timestamp();
BEGIN
    IF NEW.state = 'done' THEN
        WITH released AS (
            UPDATE job c
            SET waiting_parents = c.waiting_parents - 1,
                state = CASE WHEN c.waiting_parents > 1 THEN 'blocked'
                             WHEN c.available_at > released_at THEN 'scheduled'
                             ELSE 'pending' END,
                available_at = CASE WHEN c.waiting_parents > 1 THEN c.available_at
                                    ELSE greatest(c.available_at, released_at) END,
                updated_at = CASE WHEN c.waiting_parents > 1 THEN c.updated_at ELSE now() END
            FROM (SELECT 'blocked'::text AS blocked OFFSET 0) AS g
            WHERE c.id = ANY (ARRAY(SELECT e.child FROM job_edge e WHERE e.parent = NEW.id))
              AND c.state = g.blocked
            RETURNING c.topic, c.state
        )
        SELECT count(pg_notify(
                   CASE WHEN d.state = 'scheduled' THEN {_channel("brooq_stage.")} ELSE {_channel("brooq.")} END,
                   CASE WHEN octet_length(d.topic) < 8000 THEN d.topic ELSE '' END))
        INTO woken
        FROM (SELECT DISTINCT r.topic, r.state FROM released r WHERE r.state <> 'blocked') AS d;
    ELSE
        WITH RECURSIVE doomed(id) AS (
            SELECT e.child FROM job_edge e WHERE e.parent = NEW.id
            UNION
            SELECT e.child
            FROM doomed d
            JOIN job_edge e ON e.parent = d.id
            WHERE (SELECT c.state FROM job c WHERE c.id = d.id) = 'blocked'
        )
        UPDATE job j
        SET state = 'canceled',
            last_error = format('canceled: parent %s ended %s', NEW.id, NEW.state),
            updated_at = now()
        FROM (SELECT 'blocked'::text AS blocked OFFSET 0) AS g
        WHERE j.id = ANY (ARRAY(SELECT d.id FROM doomed d)) AND j.state = g.blocked;
    END IF;
    RETURN NULL;
END $$"""


def _previous() -> ModuleType:
    """0012's module (its file name is no importable module name)."""
    path = Path(__file__).with_name("0012_workflow_release.py")
    spec = importlib.util.spec_from_file_location("brooq_migration_0012", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def upgrade() -> None:
    op.execute(_FUNCTION)


def downgrade() -> None:
    previous: str = _previous()._FUNCTION
    op.execute(previous.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))

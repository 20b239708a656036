"""0012 workflows: a parent's end releases or cancels its children in the same transaction (SPEC D2, D3).

- ``job.has_children`` (boolean, default false: no row is rewritten) is set on
  a parent by the statement that enqueues a child naming it. That statement
  updates the parent row, so it also takes the row lock a settle of the parent
  waits for.
- The row trigger ``job_parent_ended`` fires only for a row with children
  whose state changes to done, dead or canceled (the WHEN clause is checked in
  the server without calling any function: a job without children costs
  nothing more to settle). Its function
  * on done: decrements ``waiting_parents`` of the parent's blocked children
    through ``job_edge`` (O(children)) and makes those reaching 0 pending, or
    scheduled while their ``available_at`` is ahead, waking the engines of
    their topics as the insert trigger does;
  * on dead or canceled: cancels every blocked descendant, transitively, with
    a last_error naming the parent.
  It runs for every path to those states (outcome batches, the closing
  transaction, cancel from the Store, the CLI, HTTP or psql).

Why a trigger and not a part of the settle statement: a child enqueued while
its parent's settle waits for the enqueue's row lock commits an edge that the
settle statement's snapshot, taken before that commit, cannot see. Each
statement of a trigger function takes a fresh snapshot (READ COMMITTED), after
the row lock was granted, so it sees every edge committed before the parent's
end. An enqueue that waits instead for a settle reads the parent's new state.

How the function finds the rows it changes, whatever the statistics say (a table
just filled with a workflow has none): the children by primary key from the
parent's own edges (``id = ANY (ARRAY(...))``), the state compared with a column
of a fenced subquery rather than the literal 'blocked', so that the planner
cannot read them through the waiting index instead, which holds every blocked
job of every topic (each parent's end then cost O(blocked jobs), a fan-out of
16,000 took 51 s to settle). The recursion reads a descendant's state by primary
key. ``jit = off``: the planner's estimates for the recursive statement can pass
the JIT threshold, and compiling it cost 20-30 ms for each canceled child that
has children of its own (its trigger runs too).
"""

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def _channel(prefix: str) -> str:
    return f"""CASE WHEN octet_length('{prefix}' || TG_TABLE_SCHEMA) <= 63
                    THEN '{prefix}' || TG_TABLE_SCHEMA ELSE '{prefix}' || md5(TG_TABLE_SCHEMA) END"""


# search_path FROM CURRENT: the schema the migration runs in (env.py sets it), so the
# function's statements name that schema's tables whatever the session's search_path.
_FUNCTION = f"""
CREATE FUNCTION job_parent_ended() RETURNS trigger LANGUAGE plpgsql
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


def upgrade() -> None:
    op.execute("ALTER TABLE job ADD COLUMN has_children boolean NOT NULL DEFAULT false")
    op.execute(_FUNCTION)
    op.execute(
        "CREATE TRIGGER job_parent_ended AFTER UPDATE OF state ON job FOR EACH ROW "
        "WHEN (NEW.has_children AND NEW.state IN ('done', 'dead', 'canceled') "
        "AND OLD.state IS DISTINCT FROM NEW.state) "
        "EXECUTE FUNCTION job_parent_ended()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER job_parent_ended ON job")
    op.execute("DROP FUNCTION job_parent_ended()")
    op.execute("ALTER TABLE job DROP COLUMN has_children")

"""0014 a depth cap checked without counting the queue on every enqueue (SPEC F2).

Counting a capped topic's waiting jobs on every enqueue costs O(depth) (up to
the cap). Instead every enqueue of a capped topic takes its transaction's id
and then the next value of the sequence ``job_depth_seq``, and so does every
move of a job back into a waiting state (the row trigger below; an UPDATE has
its transaction's id already). A Store keeps, per capped topic, an anchor
``(base, seq0)``: at most ``base`` waiting jobs other than those of values
above ``seq0``. Claims, ends and deletes only lower the depth, so

    waiting now <= base + (values taken since seq0)

and while that sum stays within the cap the enqueue inserts with nothing
counted. When it would not, the enqueue counts as before and refuses a full
topic. A count becomes an anchor only for a value every transaction of which
it can see: one whose transactions (their ids are all below a horizon the
Store read after taking that value) have all ended by the count's snapshot
(brooq_py/postgres/caps.py). A sequence is neither transactional nor locked:
concurrent enqueues never wait on one another for it, and a rolled-back
enqueue only loosens the bound until the next count. Setting or removing a
cap moves the sequence 2^31 ahead, past every anchor (jobs written while a
topic had no cap took no value). A job another writer adds without a value
(psql, a Store that has not seen the cap yet) is in no bound until the next
count, as it was never checked.

- ``job_depth_seq``: the sequence.
- ``job_depth_back()`` and the row trigger ``job_depth_back``: ``nextval`` for
  a row that moves from ``processing``, ``done``, ``dead`` or ``canceled`` into
  ``scheduled``, ``pending``, ``failed`` or ``blocked`` (a failed attempt, a
  reaped lease, a retry). Its ``WHEN`` clause is checked in the server without
  calling the function: claims, renewals, successes and the stager pay nothing more.

The statements find the sequence with ``to_regclass``: on a schema not yet
migrated to 0014 it is missing, ``nextval`` of NULL is NULL, and every capped
enqueue counts as before.
"""

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

_BACK = (
    "OLD.state IN ('processing', 'done', 'dead', 'canceled') "
    "AND NEW.state IN ('scheduled', 'pending', 'failed', 'blocked')"
)


def upgrade() -> None:
    op.execute("CREATE SEQUENCE job_depth_seq")
    # search_path FROM CURRENT: the schema the migration runs in (env.py sets it).
    op.execute(
        "CREATE FUNCTION job_depth_back() RETURNS trigger LANGUAGE plpgsql "
        "SET search_path FROM CURRENT AS $$ BEGIN PERFORM nextval('job_depth_seq'); RETURN NULL; END $$"
    )
    op.execute(
        "CREATE TRIGGER job_depth_back AFTER UPDATE OF state ON job FOR EACH ROW "
        f"WHEN ({_BACK}) EXECUTE FUNCTION job_depth_back()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER job_depth_back ON job")
    op.execute("DROP FUNCTION job_depth_back()")
    op.execute("DROP SEQUENCE job_depth_seq")

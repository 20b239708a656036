"""0010 the third round's columns and tables, designed once (SPEC V1-V4, N2, U1, F1-F2, D1-D4, Q4').

Every column is nullable or has a constant default, so adding it rewrites no
row and takes no longer than the lock; rows written by the second round's code
(and the S1 psql INSERT) stay valid, and old engines keep running against this
schema while new producers enqueue.

job:
- ``result`` (jsonb): the handler's return value, written with the done (V1).
- ``errors`` (jsonb array): one object per failed attempt
  ``{attempt, at, error, traceback}``, the last 20 kept (V3).
- ``progress`` (real, 0..1) and ``progress_note`` (text): written with lease
  renewals (V4).
- ``meta`` (jsonb object of strings): carried to the handler; tracing puts
  ``traceparent`` here (N2).
- ``unique_key`` (text) and the partial unique index ``job_unique_idx`` over
  the active states: at most one active job per (topic, unique_key) (U1).
- ``parents`` (uuid[]): ``Job.after`` as given (D1); ``waiting_parents``
  (integer): how many of them are not done yet; a job with waiting parents is
  in the new state ``blocked`` (D2).

job_edge (parent, child): one row per dependency, primary key led by the
parent so that releasing a parent's children reads only its own edges (D2:
O(children)); ``job_edge_child_idx`` serves the other direction (D3, D4).

topic_setting gains a token bucket per topic (F1: ``rate_limit`` tokens per
``rate_per`` seconds, at most ``rate_burst`` saved up; ``rate_tokens`` left at
``rate_at``, refilled from the database clock by the claim that spends them)
and ``max_depth`` (F2).

schedule_tick: the last tick a periodic schedule enqueued, so retention
freeing a tick's idempotency key never lets an engine make it up again (Q4').
"""

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_STATES_0008 = "'scheduled', 'pending', 'processing', 'failed', 'done', 'dead', 'canceled'"
_ACTIVE = "'scheduled', 'pending', 'processing', 'failed', 'blocked'"


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE job
            ADD COLUMN result jsonb,
            ADD COLUMN errors jsonb,
            ADD COLUMN progress real,
            ADD COLUMN progress_note text,
            ADD COLUMN meta jsonb,
            ADD COLUMN unique_key text,
            ADD COLUMN parents uuid[],
            ADD COLUMN waiting_parents integer NOT NULL DEFAULT 0
        """
    )
    op.execute("ALTER TABLE job DROP CONSTRAINT job_state_check")
    op.execute(f"ALTER TABLE job ADD CONSTRAINT job_state_check CHECK (state IN ('blocked', {_STATES_0008}))")
    op.execute(
        "CREATE UNIQUE INDEX job_unique_idx ON job (topic, unique_key) "
        f"WHERE unique_key IS NOT NULL AND state IN ({_ACTIVE})"
    )
    op.execute("DROP INDEX job_waiting_idx")
    op.execute(
        "CREATE INDEX job_waiting_idx ON job (topic, state) WHERE state IN ('scheduled', 'failed', 'blocked')"
    )
    op.execute(
        """
        CREATE TABLE job_edge (
            parent uuid NOT NULL,
            child  uuid NOT NULL,
            PRIMARY KEY (parent, child)
        )
        """
    )
    op.execute("CREATE INDEX job_edge_child_idx ON job_edge (child)")
    op.execute(
        """
        ALTER TABLE topic_setting
            ADD COLUMN rate_limit integer,
            ADD COLUMN rate_per   double precision,
            ADD COLUMN rate_burst integer,
            ADD COLUMN rate_tokens double precision,
            ADD COLUMN rate_at    timestamptz,
            ADD COLUMN max_depth  integer,
            ADD CONSTRAINT topic_setting_rate_check CHECK (
                rate_limit IS NULL OR (rate_limit > 0 AND rate_per > 0 AND rate_burst > 0)),
            ADD CONSTRAINT topic_setting_depth_check CHECK (max_depth IS NULL OR max_depth >= 0)
        """
    )
    op.execute(
        """
        CREATE TABLE schedule_tick (
            name       text        PRIMARY KEY,
            last_tick  timestamptz NOT NULL,
            updated_at timestamptz NOT NULL DEFAULT now()
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE schedule_tick")
    op.execute(
        """
        ALTER TABLE topic_setting
            DROP CONSTRAINT topic_setting_depth_check,
            DROP CONSTRAINT topic_setting_rate_check,
            DROP COLUMN max_depth,
            DROP COLUMN rate_at,
            DROP COLUMN rate_tokens,
            DROP COLUMN rate_burst,
            DROP COLUMN rate_per,
            DROP COLUMN rate_limit
        """
    )
    op.execute("DROP TABLE job_edge")
    op.execute("DROP INDEX job_waiting_idx")
    op.execute("CREATE INDEX job_waiting_idx ON job (topic, state) WHERE state IN ('scheduled', 'failed')")
    op.execute("DROP INDEX job_unique_idx")
    # A blocked job waits for parents the old schema cannot express: it becomes pending.
    op.execute("UPDATE job SET state = 'pending', available_at = now() WHERE state = 'blocked'")
    op.execute("ALTER TABLE job DROP CONSTRAINT job_state_check")
    op.execute(f"ALTER TABLE job ADD CONSTRAINT job_state_check CHECK (state IN ({_STATES_0008}))")
    op.execute(
        """
        ALTER TABLE job
            DROP COLUMN waiting_parents,
            DROP COLUMN parents,
            DROP COLUMN unique_key,
            DROP COLUMN meta,
            DROP COLUMN progress_note,
            DROP COLUMN progress,
            DROP COLUMN errors,
            DROP COLUMN result
        """
    )

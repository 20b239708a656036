"""0017 durable steps, sleeps and signals: a job's story of replays in rows (SPEC DS1-DS5).

- ``job_step (job_id, seq, name, kind, result, at)``: what a handler recorded, in the
  order it called: ``kind`` 'step' (``ctx.step``/``transaction_step``: ``result`` is
  the step's JSON), 'sleep' (``ctx.sleep``: ``{"until": ...}``) or 'wait'
  (``ctx.wait_for``: ``{"until": ...}``, the timeout's end). ``seq`` is the call's
  position in a run of the handler, so a replay that calls another step there is told
  apart from one that calls the same.
- ``job_signal (job_id, name, payload, at, woke)``: the signals sent to a job, the
  first of a name kept. ``woke`` false: the stager has yet to look whether the job
  waits for it (the partial index keeps that probe free while none is owed).
- ``job.waiting_for``: the signal a scheduled job waits for (NULL for all others).

Neither table has a foreign key to ``job``: a key check would take a share lock on the
job's row, and a signal must never wait on a row its engine or an operator holds.
Retention deletes both with their job. Adding a nullable column rewrites no row, and
the seed's INSERT into ``job`` is unchanged.
"""

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE job ADD COLUMN waiting_for text")
    op.execute(
        """
        CREATE TABLE job_step (
            job_id uuid NOT NULL,
            seq integer NOT NULL,
            name text NOT NULL,
            kind text NOT NULL DEFAULT 'step' CHECK (kind IN ('step', 'sleep', 'wait')),
            result jsonb,
            at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (job_id, seq)
        )
        """
    )
    op.execute(
        """
        CREATE TABLE job_signal (
            job_id uuid NOT NULL,
            name text NOT NULL,
            payload jsonb,
            at timestamptz NOT NULL DEFAULT now(),
            woke boolean NOT NULL DEFAULT false,
            PRIMARY KEY (job_id, name)
        )
        """
    )
    op.execute("CREATE INDEX job_signal_unwoken_idx ON job_signal (at) WHERE NOT woke")


def downgrade() -> None:
    op.execute("DROP TABLE job_signal")
    op.execute("DROP TABLE job_step")
    op.execute("ALTER TABLE job DROP COLUMN waiting_for")

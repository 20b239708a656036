"""0015 liveness per engine: one row per running engine proves it alive (SPEC P1'', F0, L5', W0).

Until now each processing row carried its own lease, renewed by its engine's
heartbeat every lease/3: one job-row write per running job per period, a write
an operator's row lock, a trigger's cascade or the engine's own completer could
block. From this revision an engine proves it is alive by updating its own row
in ``engine``, which nothing done to job rows can block; the reaper takes a
processing job back only when its engine's proof is older than its lease plus
its margin, when the engine named the claim in ``dropped`` (hung, given up,
fenced), or, for a row whose engine has no row (an engine of an older release,
``run_once``), when the row's own ``locked_until`` has passed.

- ``engine``: id (a job's ``locked_by``), instance (the running engine that owns
  the id: a second live engine given the same id is refused), host, pid,
  started_at, seen_at (the database clock at its last heartbeat), lease and
  margin (what the reaper waits past seen_at), dropped (claim tokens it let go
  without an outcome).
- ``job.crashes``: how many engines stopped while running the job (L5'); a
  crash gives its attempt back, and ``KindOptions.max_crashes`` of them make the
  job dead.
- ``job_in_flight``: the seed's "what is in flight, who holds it, and is its
  lease expired?" as one view over processing rows and their engines.

Every column has a constant default: adding them rewrites no row.
"""

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE engine (
            id text PRIMARY KEY,
            instance uuid,
            host text NOT NULL DEFAULT '',
            pid integer NOT NULL DEFAULT 0,
            started_at timestamptz NOT NULL DEFAULT now(),
            seen_at timestamptz NOT NULL DEFAULT now(),
            lease interval NOT NULL,
            margin interval NOT NULL,
            dropped uuid[] NOT NULL DEFAULT '{}'
        ) WITH (fillfactor = 50)
        """
    )
    op.execute("ALTER TABLE job ADD COLUMN crashes integer NOT NULL DEFAULT 0")
    op.execute(
        """
        CREATE VIEW job_in_flight AS
        SELECT j.id, j.topic, j.attempts, j.locked_by, j.claim_token, j.updated_at AS claimed_at,
               e.host, e.pid, e.seen_at,
               coalesce(e.seen_at + e.lease, j.locked_until) AS lease_until,
               CASE WHEN e.id IS NULL THEN j.locked_until < now()
                    ELSE e.seen_at + e.lease + e.margin < now() OR j.claim_token = ANY (e.dropped)
               END AS expired
        FROM job j LEFT JOIN engine e ON e.id = j.locked_by
        WHERE j.state = 'processing'
        """
    )


def downgrade() -> None:
    op.execute("DROP VIEW job_in_flight")
    op.execute("ALTER TABLE job DROP COLUMN crashes")
    op.execute("DROP TABLE engine")

"""0001 job: the job table, its state CHECKs and its three partial indexes (SPEC S1, S2, S4)."""

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE job (
            id              uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
            topic           text        NOT NULL,
            payload         jsonb       NOT NULL,
            state           text        NOT NULL DEFAULT 'pending',
            attempts        integer     NOT NULL DEFAULT 0,
            available_at    timestamptz NOT NULL DEFAULT now(),
            locked_by       text,
            locked_until    timestamptz,
            last_error      text,
            idempotency_key text,
            created_at      timestamptz NOT NULL DEFAULT now(),
            updated_at      timestamptz NOT NULL DEFAULT now(),
            CONSTRAINT job_state_check CHECK (
                state IN ('pending', 'processing', 'failed', 'done', 'dead', 'canceled')
            ),
            CONSTRAINT job_processing_locked_check CHECK (
                state <> 'processing' OR (locked_by IS NOT NULL AND locked_until IS NOT NULL)
            )
        )
        """
    )
    # Ready jobs in claim order: a claim reads the head of this index and stops.
    op.execute("CREATE INDEX job_claim_idx ON job (available_at, id) WHERE state IN ('pending', 'failed')")
    # The reaper looks only at processing rows whose lease ran out.
    op.execute("CREATE INDEX job_lease_expiry_idx ON job (locked_until) WHERE state = 'processing'")
    # Retention reads terminal rows oldest first; the index does not grow with the work queue.
    op.execute(
        "CREATE INDEX job_retention_idx ON job (updated_at) WHERE state IN ('done', 'dead', 'canceled')"
    )


def downgrade() -> None:
    op.execute("DROP TABLE job")

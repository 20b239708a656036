"""0002 idempotency: one job per (topic, key) for the whole life of the row (SPEC E1)."""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "CREATE UNIQUE INDEX job_idempotency_idx ON job (topic, idempotency_key) "
        "WHERE idempotency_key IS NOT NULL"
    )


def downgrade() -> None:
    op.execute("DROP INDEX job_idempotency_idx")

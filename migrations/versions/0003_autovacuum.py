"""0003 autovacuum: frequent short passes suit a table of constant inserts and deletes."""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "ALTER TABLE job SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 100)"
    )


def downgrade() -> None:
    op.execute("ALTER TABLE job RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold)")

"""0009 waiting index: per-topic depth of scheduled and failed jobs without a scan (SPEC O1, Z2).

The engine's refresher counts each topic's jobs per active state every few
seconds, each count capped. Pending rows are counted on the claim index and
processing rows are few; scheduled and failed rows can number millions and no
other index leads with their topic. This one does, and only their rows enter
it: the hot path (a job enqueued for now, claimed, settled) never writes to it.
"""

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE INDEX job_waiting_idx ON job (topic, state) WHERE state IN ('scheduled', 'failed')")


def downgrade() -> None:
    op.execute("DROP INDEX job_waiting_idx")

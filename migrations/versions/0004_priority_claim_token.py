"""0004 priority and claim token (SPEC S1, C1, P3).

The claim index becomes per topic, in claim order: a claim runs one index
scan per topic (a LATERAL join over the topics), each reading the head of
its topic and stopping at the limit. An ``= any(array)`` filter on topic
cannot be read in index order, and a topic with nothing ready must stay
cheap however many jobs of other topics wait (SPEC S4).
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE job ADD COLUMN priority integer NOT NULL DEFAULT 0, ADD COLUMN claim_token uuid")
    op.execute("DROP INDEX job_claim_idx")
    op.execute(
        "CREATE INDEX job_claim_idx ON job (topic, priority DESC, available_at, id) "
        "WHERE state IN ('pending', 'failed')"
    )


def downgrade() -> None:
    op.execute("DROP INDEX job_claim_idx")
    op.execute("ALTER TABLE job DROP COLUMN claim_token, DROP COLUMN priority")
    op.execute("CREATE INDEX job_claim_idx ON job (available_at, id) WHERE state IN ('pending', 'failed')")

"""0007 topic settings: pause and a global concurrency limit per topic (SPEC Q2, Q3).

One small row per topic an operator has touched; a topic without a row is
running and unlimited. Engines read it at claim time, so a pause or a limit
holds on every host from its next claim.
"""

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE topic_setting (
            topic             text        PRIMARY KEY,
            paused            boolean     NOT NULL DEFAULT false,
            concurrency_limit integer,
            updated_at        timestamptz NOT NULL DEFAULT now(),
            CONSTRAINT topic_setting_limit_check CHECK (concurrency_limit IS NULL OR concurrency_limit >= 0)
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE topic_setting")

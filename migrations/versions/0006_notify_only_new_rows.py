"""0006 wake-up NOTIFY only for statements that inserted rows (SPEC E6).

0005's statement-level trigger also fired for an enqueue whose (topic, key)
already existed (ON CONFLICT DO NOTHING inserts nothing), waking every idle
worker for nothing. The trigger now sees the statement's new rows as a
transition table and notifies only when there is one.
"""

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_CHANNEL = """
    CASE WHEN octet_length('brooq.' || TG_TABLE_SCHEMA) <= 63
         THEN 'brooq.' || TG_TABLE_SCHEMA
         ELSE 'brooq.' || md5(TG_TABLE_SCHEMA)
    END"""


def _replace(body: str, referencing: str) -> None:
    """Recreate job_notify() with *body* and its statement trigger, *referencing* a transition table or not."""
    op.execute("DROP TRIGGER job_notify ON job")
    op.execute(
        f"CREATE OR REPLACE FUNCTION job_notify() RETURNS trigger LANGUAGE plpgsql AS $$ "
        f"BEGIN {body} RETURN NULL; END $$"
    )
    op.execute(
        f"CREATE TRIGGER job_notify AFTER INSERT ON job {referencing}FOR EACH STATEMENT EXECUTE FUNCTION job_notify()"
    )


def upgrade() -> None:
    _replace(
        f"IF EXISTS (SELECT 1 FROM inserted) THEN PERFORM pg_notify({_CHANNEL}, ''); END IF;",
        "REFERENCING NEW TABLE AS inserted ",
    )


def downgrade() -> None:
    _replace(f"PERFORM pg_notify({_CHANNEL}, '');", "")

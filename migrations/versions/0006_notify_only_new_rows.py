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


def upgrade() -> None:
    op.execute("DROP TRIGGER job_notify ON job")
    op.execute(
        f"""
        CREATE OR REPLACE FUNCTION job_notify() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF EXISTS (SELECT 1 FROM inserted) THEN
                PERFORM pg_notify({_CHANNEL}, '');
            END IF;
            RETURN NULL;
        END
        $$
        """
    )
    op.execute(
        "CREATE TRIGGER job_notify AFTER INSERT ON job REFERENCING NEW TABLE AS inserted "
        "FOR EACH STATEMENT EXECUTE FUNCTION job_notify()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER job_notify ON job")
    op.execute(
        f"""
        CREATE OR REPLACE FUNCTION job_notify() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify({_CHANNEL}, '');
            RETURN NULL;
        END
        $$
        """
    )
    op.execute(
        "CREATE TRIGGER job_notify AFTER INSERT ON job FOR EACH STATEMENT EXECUTE FUNCTION job_notify()"
    )

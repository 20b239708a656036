"""0005 wake-up NOTIFY on every insert path (SPEC E6).

A statement-level trigger sends one notification per INSERT statement,
whatever its row count (a psql INSERT included); PostgreSQL folds identical
notifications of one transaction into one and delivers them at commit only.
The channel carries the schema: ``'brooq.' || schema`` when that fits in 63
bytes, else ``'brooq.' || md5(schema)`` (``brooq_py.postgres.channel_for``
applies the same rule). It is computed from the trigger's own table schema.
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE FUNCTION job_notify() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify(
                CASE WHEN octet_length('brooq.' || TG_TABLE_SCHEMA) <= 63
                     THEN 'brooq.' || TG_TABLE_SCHEMA
                     ELSE 'brooq.' || md5(TG_TABLE_SCHEMA)
                END,
                '');
            RETURN NULL;
        END
        $$
        """
    )
    op.execute(
        "CREATE TRIGGER job_notify AFTER INSERT ON job FOR EACH STATEMENT EXECUTE FUNCTION job_notify()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER job_notify ON job")
    op.execute("DROP FUNCTION job_notify()")

"""0011 a cancel of a running job wakes the engine that holds it (SPEC X2').

An AFTER UPDATE row trigger fires only when a row moves from ``processing`` to
``canceled`` (``Store.cancel``, the CLI, HTTP, the dashboard, or the documented
psql ``UPDATE job SET state = 'canceled' WHERE id = ...``) and sends the row's
id and claim token on the cancel channel ``brooq_cancel.<schema>`` (``md5(schema)``
in place of the schema past 63 bytes), at commit. The engine that holds that
claim cancels its handler's ctx at once instead of at its next heartbeat. Its
``WHEN`` clause is evaluated per updated row and queues nothing for any other
move, so claims, renewals and outcome writes pay nothing more than that test.
"""

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

_CHANNEL = """
    CASE WHEN octet_length('brooq_cancel.' || TG_TABLE_SCHEMA) <= 63
         THEN 'brooq_cancel.' || TG_TABLE_SCHEMA
         ELSE 'brooq_cancel.' || md5(TG_TABLE_SCHEMA)
    END"""


def upgrade() -> None:
    op.execute(
        "CREATE FUNCTION job_cancel_notify() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        f"PERFORM pg_notify({_CHANNEL}, NEW.id::text || ' ' || coalesce(NEW.claim_token::text, '')); "
        "RETURN NULL; END $$"
    )
    op.execute(
        "CREATE TRIGGER job_cancel_notify AFTER UPDATE OF state ON job FOR EACH ROW "
        "WHEN (OLD.state = 'processing' AND NEW.state = 'canceled') EXECUTE FUNCTION job_cancel_notify()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER job_cancel_notify ON job")
    op.execute("DROP FUNCTION job_cancel_notify()")

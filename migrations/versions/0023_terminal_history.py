"""0023 terminal history in tables of a day each, dropped whole (SPEC B2).

With ``Config(history_after=...)``, retention moves each ended job, some time after its
end, from ``job`` to the table of its day (``job_history_YYYYMMDD``, UTC), and drops a
day's table whole once all of it is older than ``retention_ttl``. Each such table
inherits ``job``: ``SELECT … FROM job`` still returns every job, active or ended
(SPEC B3), and a job's fate is still one SELECT of ``job``. Retention creates the tables
as days come (postgres/sql/history_create.sql): this revision adds nothing on the way
up. Its downgrade puts the rows of every table of history back into ``job`` and drops
those tables, so that the revisions below it find ``job`` as they left it.
"""

from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

# The tables of history of the current schema: the children of job named job_history_YYYYMMDD.
_TABLES = (
    "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
    "WHERE i.inhparent = 'job'::regclass AND c.relname ~ '^job_history_[0-9]{8}$' ORDER BY 1"
)


def upgrade() -> None:
    pass


def downgrade() -> None:
    op.execute(
        f"""
        DO $$
        DECLARE
            t text;
        BEGIN
            FOR t IN {_TABLES} LOOP
                EXECUTE format('LOCK TABLE %I IN ACCESS EXCLUSIVE MODE', t);
                EXECUTE format('INSERT INTO job SELECT * FROM ONLY %I', t);
                EXECUTE format('DROP TABLE %I', t);
            END LOOP;
        END $$
        """
    )

"""0025 a day's table of history is made and dropped by the owner of job (SPEC B2).

``CREATE TABLE … INHERITS (job)`` and ``DROP TABLE`` are the owner's alone, and engines often
run as a role with DML grants only (migrations as the owner): with the history on by default,
every retention pass of such an engine failed. Two functions run as the owner of job (``SECURITY
DEFINER``, their search path this schema and then pg_temp): ``job_history_create(day)`` makes
the day's table, its index and the grants ``job`` has (so whoever may write ``job`` may move
rows into the day, bring them back and lock it), and ``job_history_drop(day)`` drops it, for a
session whose user may delete from ``job`` (no more than such a user can do row by row). A day
is eight digits, nothing else. The tables of history made before this revision get ``job``'s
grants too. The downgrade drops the functions and leaves the tables.
"""

from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

_CREATE = """
CREATE FUNCTION job_history_create(day text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
DECLARE
    t text := 'job_history_' || day;
    g record;
BEGIN
    IF day !~ '^[0-9]{{8}}$' THEN
        RAISE EXCEPTION 'not a day (YYYYMMDD): %', day USING ERRCODE = 'invalid_parameter_value';
    END IF;
    EXECUTE format(
        'CREATE TABLE IF NOT EXISTS %I ('
        '  CONSTRAINT job_history_terminal CHECK (state IN (''done'', ''dead'', ''canceled'')),'
        '  CONSTRAINT job_history_keyless CHECK (idempotency_key IS NULL),'
        '  PRIMARY KEY (id)'
        ') INHERITS (job)', t);
    EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %I (updated_at)', t || '_ended', t);
    FOR g IN
        SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(r.rolname) END AS who,
               a.privilege_type AS what
        FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
        LEFT JOIN pg_roles r ON r.oid = a.grantee
        WHERE c.oid = 'job'::regclass AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('GRANT %s ON %I TO %s', g.what, t, g.who);
    END LOOP;
END $$
"""

_DROP = """
CREATE FUNCTION job_history_drop(day text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_temp AS $$
BEGIN
    IF day !~ '^[0-9]{{8}}$' THEN
        RAISE EXCEPTION 'not a day (YYYYMMDD): %', day USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT has_table_privilege(session_user, 'job', 'DELETE') THEN
        RAISE EXCEPTION 'permission denied to drop a day of history: % has no DELETE on job',
            session_user USING ERRCODE = 'insufficient_privilege';
    END IF;
    EXECUTE format('DROP TABLE %I', 'job_history_' || day);
END $$
"""

# The days that have a table of history already (0023's tables, made by their engines).
_DAYS = (
    "SELECT substr(c.relname, 13) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
    "WHERE i.inhparent = 'job'::regclass AND c.relname ~ '^job_history_[0-9]{8}$'"
)


def upgrade() -> None:
    schema = '"' + op.get_bind().exec_driver_sql("SELECT current_schema()").scalar().replace('"', '""') + '"'
    op.execute(_CREATE.format(schema=schema))
    op.execute(_DROP.format(schema=schema))
    op.execute(f"SELECT job_history_create(d) FROM ({_DAYS}) AS days(d)")


def downgrade() -> None:
    op.execute("DROP FUNCTION job_history_drop(text)")
    op.execute("DROP FUNCTION job_history_create(text)")

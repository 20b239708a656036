"""What the tests of the terminal history share (SPEC B2, B3): jobs ended by the test's own write,
where a job is, the day tables, a day made by a move, and a move held open while another statement
waits for its row."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import ConnectionPool

from brooq_py.postgres import Store
from brooq_py.queue import Job
from tests.integration.conftest import q
from tests.integration.marks import blocked_by, in_thread
from tests.polling import wait_for

TTL = timedelta(days=30)
AFTER = timedelta(seconds=0.5)


def ended(dsn: str, schema: str, ids: list[str], state: str, days_ago: float = 0.0) -> None:
    """Make *ids* ended in *state*, *days_ago* days ago (the psql way: the test's own write)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "UPDATE {} SET state = %s, updated_at = now() - make_interval(secs => %s) - interval '1 second'"
                " WHERE id = ANY(%s::uuid[])"
            ).format(sql.Identifier(schema, "job")),
            (state, days_ago * 86400, ids),
        )


def where(pool: ConnectionPool[Any], schema: str, job_id: str) -> str | None:
    """The table that holds *job_id*: ``job``, ``job_history_YYYYMMDD``, or None."""
    rows = q(pool, schema, "SELECT tableoid::regclass::text FROM {job} WHERE id = %s", job_id)
    return str(rows[0][0]).split(".")[-1].strip('"') if rows else None


def days(pool: ConnectionPool[Any], schema: str) -> list[str]:
    """The tables of history of the schema."""
    rows = q(
        pool,
        schema,
        "SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhparent = %s::regclass ORDER BY 1",
        f'"{schema}".job',
    )
    return [str(r[0]) for r in rows]


def live_count(pool: ConnectionPool[Any], schema: str) -> int:
    return int(q(pool, schema, "SELECT count(*) FROM ONLY {job}")[0][0])


def move(store: Store, batch: int = 10) -> list[tuple[str, str]]:
    """The mover's batch (``Store.move_terminal``) of jobs ended over AFTER ago: (id, topic) moved."""
    return store.move_terminal(AFTER, TTL, batch)


def short(table: str) -> str:
    """A day table's own name, without its schema."""
    return table.split(".")[-1].strip('"')


def made_day(dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]) -> str:
    """Today's table of history, made by a move of a job ended a second ago (the ``day_table``
    fixture)."""
    first = store.enqueue(Job("h", {})).id
    ended(dsn, schema, [first], "done")
    assert move(store)
    (table,) = days(pool, schema)
    return table


def move_open(conn: psycopg.Connection[Any], schema: str, table: str, job_id: str) -> None:
    conn.execute(
        sql.SQL(
            "WITH m AS (DELETE FROM ONLY {} WHERE id = %s RETURNING *) INSERT INTO {} SELECT * FROM m"
        ).format(sql.Identifier(schema, "job"), sql.SQL(table)),
        (job_id,),
    )


def while_moving(
    dsn: str,
    mover: psycopg.Connection[Any],
    fn: Callable[[], Any],
    what: str,
    meanwhile: Callable[[], Any] = lambda: None,
) -> tuple[list[Any], list[BaseException]]:
    """Run *fn* on a thread until it waits for the row *mover* holds, call *meanwhile*, commit the
    move, and wait for *fn*: what it returned and what it raised."""
    t, out, errors = in_thread(fn)
    wait_for(lambda: blocked_by(dsn, mover.info.backend_pid) > 0, f"{what} to wait for the row", 30)
    meanwhile()
    mover.commit()
    t.join(30)
    return out, errors


@contextmanager
def app_role(dsn: str, schema: str, *, owner: bool = False, create: bool = False) -> Iterator[str]:
    """A role of its own (unique name, dropped after) with DML on every object of *schema*, as an
    application role gets where migrations run as the owner; *create*: CREATE on the schema too;
    *owner*: it owns ``job`` as well, so it may make and drop the days of history."""
    role = f"brooq_app_{uuid.uuid4().hex[:12]}"
    s, r = sql.Identifier(schema), sql.Identifier(role)
    statements = [
        "CREATE ROLE {r} NOLOGIN",
        "GRANT USAGE, CREATE ON SCHEMA {s} TO {r}" if create else "GRANT USAGE ON SCHEMA {s} TO {r}",
        "GRANT ALL ON ALL TABLES IN SCHEMA {s} TO {r}",
        "GRANT ALL ON ALL SEQUENCES IN SCHEMA {s} TO {r}",
        "GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {s} TO {r}",
    ]
    if owner:
        statements.append("ALTER TABLE {s}.job OWNER TO {r}")
    with psycopg.connect(dsn, autocommit=True) as conn:
        for st in statements:
            conn.execute(sql.SQL(st).format(s=s, r=r))
    try:
        yield role
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("REASSIGN OWNED BY {r} TO CURRENT_USER").format(r=r))
            conn.execute(sql.SQL("DROP OWNED BY {r}").format(r=r))
            conn.execute(sql.SQL("DROP ROLE {r}").format(r=r))


@contextmanager
def store_as(dsn: str, schema: str, role: str | None, settings: str = "") -> Iterator[Store]:
    """A Store whose pool's sessions run as *role* (SET ROLE from the test's superuser; None: as
    it), with *settings* (``-c name=value ...``) besides."""
    options = conninfo_to_dict(dsn).get("options") or ""
    extra = (f"-c role={role} " if role else "") + settings
    role_dsn = make_conninfo(dsn, options=f"{options} {extra}".strip())
    p: ConnectionPool[Any] = ConnectionPool(role_dsn, min_size=1, max_size=4, open=True)
    s = Store(p, schema=schema)
    try:
        yield s
    finally:
        s.close()
        p.close()


def foreign_day(dsn: str, schema: str, table: str) -> None:
    """Make the day's *table* another role's (the test's): a day made by hand, or by an engine of a
    release before the days went to the owner of job, which an engine's role may not write nor drop
    without a grant."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("ALTER TABLE {} OWNER TO CURRENT_USER").format(sql.Identifier(schema, short(table)))
        )


def run_sql(dsn: str, statement: sql.Composable, params: Any = None) -> None:
    """One statement of the test's own (an operator's), on a connection of its own."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(statement, params)


def day_ago(pool: ConnectionPool[Any], schema: str, days_ago: int) -> str:
    """The UTC day (YYYYMMDD) *days_ago* days ago."""
    rows = q(
        pool,
        schema,
        "SELECT to_char((now() AT TIME ZONE 'UTC') - make_interval(days => %s), 'YYYYMMDD')",
        days_ago,
    )
    return str(rows[0][0])


def day_of(pool: ConnectionPool[Any], schema: str, job_id: str) -> str:
    """The UTC day (YYYYMMDD) *job_id* ended on, wherever it is."""
    rows = q(
        pool,
        schema,
        "SELECT to_char(updated_at AT TIME ZONE 'UTC', 'YYYYMMDD') FROM {job} WHERE id = %s",
        job_id,
    )
    return str(rows[0][0])


def same_end(dsn: str, schema: str, ids: list[str], like: str) -> None:
    """Give *ids* (in job) the end (updated_at, state done) of *like*, wherever *like* is: its day."""
    run_sql(
        dsn,
        sql.SQL(
            "UPDATE ONLY {j} SET state = 'done', updated_at = (SELECT updated_at FROM {j} WHERE id = %s)"
            " WHERE id = ANY(%s::uuid[])"
        ).format(j=sql.Identifier(schema, "job")),
        (like, ids),
    )


def stranger(dsn: str, schema: str, day: str) -> None:
    """A table of the day's name that is no child of job (docs/operating.md: never moved into)."""
    run_sql(
        dsn,
        sql.SQL("CREATE TABLE {} (LIKE {})").format(
            sql.Identifier(schema, f"job_history_{day}"), sql.Identifier(schema, "job")
        ),
    )


@contextmanager
def owner_group(dsn: str, schema: str, members: int) -> Iterator[list[str]]:
    """A group role that owns job (CREATE on the schema, DML on its tables) and *members* login-less
    roles in it (INHERIT): per-instance engine credentials, as docs/operating.md describes them."""
    tag = uuid.uuid4().hex[:10]
    group = f"brooq_grp_{tag}"
    names = [f"brooq_m{i}_{tag}" for i in range(members)]
    s, g = sql.Identifier(schema), sql.Identifier(group)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(g))
        for st in (
            "GRANT USAGE, CREATE ON SCHEMA {s} TO {g}",
            "GRANT ALL ON ALL TABLES IN SCHEMA {s} TO {g}",
            "GRANT ALL ON ALL SEQUENCES IN SCHEMA {s} TO {g}",
            "GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {s} TO {g}",
            "ALTER TABLE {s}.job OWNER TO {g}",
        ):
            conn.execute(sql.SQL(st).format(s=s, g=g))
        for n in names:
            conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN INHERIT IN ROLE {}").format(sql.Identifier(n), g))
    try:
        yield names
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for n in [*names, group]:
                conn.execute(sql.SQL("REASSIGN OWNED BY {} TO CURRENT_USER").format(sql.Identifier(n)))
                conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(n)))
                conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(n)))


@contextmanager
def attacker(dsn: str, schema: str) -> Iterator[str]:
    """A role with USAGE and CREATE on the job table's schema and nothing on its tables: another
    application sharing the schema (docs/operating.md: "another role with CREATE on the schema"),
    or, on a database made before PostgreSQL 15 (pg_upgrade keeps it), any role at all in
    ``public``."""
    role = f"brooq_x_{uuid.uuid4().hex[:12]}"
    s, r = sql.Identifier(schema), sql.Identifier(role)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(r))
        conn.execute(sql.SQL("GRANT USAGE, CREATE ON SCHEMA {} TO {}").format(s, r))
    try:
        yield role
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("REASSIGN OWNED BY {} TO CURRENT_USER").format(r))
            conn.execute(sql.SQL("DROP OWNED BY {}").format(r))
            conn.execute(sql.SQL("DROP ROLE {}").format(r))


def run_sql_as(dsn: str, role: str, statement: sql.Composable) -> None:
    """One statement run as *role* (SET ROLE from the test's superuser)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
        conn.execute(statement)


def privileges_on_job(dsn: str, schema: str, role: str) -> list[str]:
    """What *role* may do to job, of SELECT, INSERT, UPDATE, DELETE, TRUNCATE."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT p FROM unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE']) p"
            " WHERE has_table_privilege(%s, %s::regclass, p)",
            (role, f'"{schema}".job'),
        ).fetchall()
    return [str(r[0]) for r in rows]

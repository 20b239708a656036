"""Review of "History: what the role may do with each day is read from the catalog at every pass"
(SPEC B2, B3, T1). Each test here failed on the change as reviewed; two (the NOT NULL child, row-level
security on a day the mover writes) passed on 503c00c, before it: regressions."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.postgres import Store
from brooq_py.queue import Job
from tests.integration.history import (
    AFTER,
    TTL,
    app_role,
    day_of,
    ended,
    foreign_day,
    move,
    owner_group,
    run_sql,
    same_end,
    store_as,
    stranger,
    where,
)

# -- helpers ------------------------------------------------------------------------------------


def _table(schema: str, day: str) -> sql.Identifier:
    return sql.Identifier(schema, f"job_history_{day}")


def _as_engine_makes(dsn: str, schema: str, day: str) -> None:
    """A day's table made by hand with the engine's own DDL (history_create.sql)."""
    run_sql(
        dsn,
        sql.SQL(
            "CREATE TABLE {} ("
            " CONSTRAINT job_history_terminal CHECK (state IN ('done', 'dead', 'canceled')),"
            " CONSTRAINT job_history_keyless CHECK (idempotency_key IS NULL),"
            " PRIMARY KEY (id)) INHERITS ({})"
        ).format(_table(schema, day), sql.Identifier(schema, "job")),
    )


def _passes(fn: Any, n: int) -> list[str]:
    """Run *fn* *n* times as the Ticker runs a pass (a failure is logged, the next pass comes);
    what each pass that failed raised."""
    failed = []
    for _ in range(n):
        try:
            fn()
        except Exception as exc:
            failed.append(f"{type(exc).__name__}: {exc}".splitlines()[0])
    return failed


# -- B2 / health: a hand-made child that passes the "ours" test but refuses rows ----------------


def test_b2_a_child_with_a_not_null_column_fails_every_pass_and_holds_back_every_later_day(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """history_tables.sql calls a table "ours" from its parent, two constraint names and a column
    count. A day made with the engine's own DDL and then given a NOT NULL on an inherited nullable
    column (PostgreSQL 15 keeps NOT NULL out of pg_constraint; an extra CHECK of any other name
    does the same) passes the test, so the mover writes into it. The change dropped the catch of
    NotNullViolation / CheckViolation that refused such a day: the INSERT fails, move() raises,
    and since the batch is the oldest rows first it raises at every pass (the engine is unhealthy,
    every retention tick fails) and no later day ever moves (SPEC B2: a refused day never holds
    back the others; the engine stays healthy whatever tables an operator sets up)."""
    x = store.enqueue(Job("h", {"n": "x"})).id
    ended(dsn, schema, [x], "done", days_ago=2)
    day = day_of(pool, schema, x)
    _as_engine_makes(dsn, schema, day)
    run_sql(dsn, sql.SQL("ALTER TABLE {} ALTER COLUMN result SET NOT NULL").format(_table(schema, day)))
    z = store.enqueue(Job("h", {"n": "z"})).id
    ended(dsn, schema, [z], "done")  # today's
    failed = _passes(lambda: move(store), 5)
    assert where(pool, schema, x) == "job"
    assert where(pool, schema, z) != "job", f"today's job held back; passes failed: {failed}"
    assert failed == [], failed


# -- B2: a hand-made child whose columns are in another order passes as ours: jobs corrupted -----


def _reordered_child(dsn: str, schema: str, day: str, swap: tuple[str, str]) -> None:
    """A child of job made as a standalone table, then ALTER TABLE … INHERIT (PostgreSQL matches the
    columns by name, not position): the engine's two checks, its primary key, the same columns,
    with the two of *swap* in each other's place."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        cols = conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod), attnotnull FROM pg_attribute"
            " WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            (sql.Identifier(schema, "job").as_string(conn),),
        ).fetchall()
        names = [c[0] for c in cols]
        i, j = names.index(swap[0]), names.index(swap[1])
        cols[i], cols[j] = cols[j], cols[i]
        checks = conn.execute(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE conrelid = %s::regclass AND contype = 'c'",
            (sql.Identifier(schema, "job").as_string(conn),),
        ).fetchall()
        parts = [
            sql.SQL("{} {}{}").format(sql.Identifier(n), sql.SQL(t), sql.SQL(" NOT NULL" if nn else ""))
            for n, t, nn in cols
        ]
        parts += [sql.SQL("CONSTRAINT {} {}").format(sql.Identifier(n), sql.SQL(d)) for n, d in checks]
        parts += [
            sql.SQL("CONSTRAINT job_history_terminal CHECK (state IN ('done', 'dead', 'canceled'))"),
            sql.SQL("CONSTRAINT job_history_keyless CHECK (idempotency_key IS NULL)"),
            sql.SQL("PRIMARY KEY (id)"),
        ]
        conn.execute(sql.SQL("CREATE TABLE {} ({})").format(_table(schema, day), sql.SQL(", ").join(parts)))
        conn.execute(
            sql.SQL("ALTER TABLE {} INHERIT {}").format(_table(schema, day), sql.Identifier(schema, "job"))
        )


def test_b2_a_child_with_its_columns_in_another_order_is_written_and_the_jobs_moved_are_corrupted(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """A table of a day's name made by hand (CREATE TABLE, then ALTER TABLE … INHERIT job) with the
    engine's checks and primary key and job's columns, two of them (result, meta: both jsonb) in
    each other's place, passes the "ours" test (a child, the two names, the same count). The move is
    `INSERT INTO day SELECT * FROM moved`: by position, so each job moved there has its result and
    its meta swapped as `SELECT … FROM job` reads them (by name). store.get / result return another
    job's value: a job changed by a move (SPEC B2: never lost nor altered; a table not ours is never
    written)."""
    x = store.enqueue(Job("h", {"n": "x"})).id
    ended(dsn, schema, [x], "done", days_ago=2)
    run_sql(
        dsn,
        sql.SQL("UPDATE ONLY {} SET result = %s::jsonb, meta = %s::jsonb WHERE id = %s").format(
            sql.Identifier(schema, "job")
        ),
        ('{"answer": 42}', '{"owner": "alice"}', x),
    )
    before = store.get(x)
    assert before is not None and before.result == {"answer": 42}
    _reordered_child(dsn, schema, day_of(pool, schema, x), ("result", "meta"))
    move(store)  # moves x into the hand-made table (it is "ours")
    after = store.get(x)
    assert after is not None
    assert (after.result, dict(after.meta)) == (before.result, dict(before.meta)), (
        f"moved into {where(pool, schema, x)}: result {after.result!r}, meta {dict(after.meta)!r}"
    )


# -- B2: a fix counts at the next pass ... unless a later day moved meanwhile -------------------


def test_b2_a_stranger_removed_counts_at_the_next_pass_even_after_a_later_day_moved(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """docs/operating.md: "a grant, an owner or a table you change counts from the next pass,
    without a restart". But the mover's mark (_since) moves on past the refused day's rows as soon
    as a later day moves, and history_lock reads only rows ended after the mark; the mark is reset
    only when the mover makes a table, which it does only for a row it locked. Once the operator
    drops the stranger table, the refused day's rows are never read again: they stay in job (the hot
    path) until the ttl, exactly as when the refusal lasted until a restart (the behaviour the
    change says it removed)."""
    x = store.enqueue(Job("h", {"n": "x"})).id
    ended(dsn, schema, [x], "done", days_ago=2)
    refused = day_of(pool, schema, x)
    stranger(dsn, schema, refused)
    z = store.enqueue(Job("h", {"n": "z"})).id
    ended(dsn, schema, [z], "done")  # today's: moves, the mark passes x
    move(store)
    assert where(pool, schema, x) == "job" and where(pool, schema, z) != "job"
    run_sql(dsn, sql.SQL("DROP TABLE {}").format(_table(schema, refused)))  # the operator's fix
    for _ in range(3):
        move(store)
    assert where(pool, schema, x) == f"job_history_{refused}", "the fixed day's job never moves"


def test_b2_a_grant_counts_at_the_next_pass_even_after_a_later_day_moved(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """As test_b2_a_day_granted_later_moves_at_the_next_pass_and_was_said_once_meanwhile
    (test_review_history_fallback.py), with one job of today beside: the engine moves today's job
    (it makes today's table), its mark passes the refused day, and the grant that follows never
    counts: the granted day's job stays in job until the ttl (or a restart)."""
    with app_role(dsn, schema, owner=True, create=True) as role, store_as(dsn, schema, role) as engine_store:
        x = store.enqueue(Job("h", {"n": "x"})).id
        ended(dsn, schema, [x], "done", days_ago=2)
        assert [i for i, _ in move(store)] == [x]
        table = where(pool, schema, x)
        foreign_day(dsn, schema, str(table))  # no grant to *role*
        y = store.enqueue(Job("h", {"n": "y"})).id
        same_end(dsn, schema, [y], like=x)
        z = store.enqueue(Job("h", {"n": "z"})).id
        ended(dsn, schema, [z], "done")  # today's
        assert [i for i, _ in engine_store.move_terminal(AFTER, TTL, 10)] == [z]
        run_sql(
            dsn,
            sql.SQL("GRANT INSERT, SELECT, DELETE ON {} TO {}").format(
                sql.Identifier(schema, str(table)), sql.Identifier(role)
            ),
        )
        for _ in range(3):
            engine_store.move_terminal(AFTER, TTL, 10)
        assert where(pool, schema, y) == table, "the granted day's job never moves"


# -- B2 / health: the catalog says "writable" while the writes are refused (row-level security) ---


def test_b2_row_level_security_on_a_day_fails_every_pass_and_holds_back_every_later_day(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """writable is has_table_privilege INSERT and SELECT. A day with row-level security enabled (a
    blanket `ENABLE ROW LEVEL SECURITY` on every table of the schema, as some hosted Postgres
    advisors ask) and no policy for the engine's role has both, yet refuses every row it inserts
    ("new row violates row-level security policy", InsufficientPrivilege, which the change no longer
    catches). The engine's role owns job (it makes days); the day was made by another role (the
    test's superuser, another engine). Every pass of the mover raises, and no later day moves."""
    x = store.enqueue(Job("h", {"n": "x"})).id
    ended(dsn, schema, [x], "done", days_ago=2)
    assert [i for i, _ in move(store)] == [x]
    table = str(where(pool, schema, x))
    foreign_day(dsn, schema, table)  # the day is the test's role's
    run_sql(dsn, sql.SQL("ALTER TABLE {} ENABLE ROW LEVEL SECURITY").format(sql.Identifier(schema, table)))
    with app_role(dsn, schema, owner=True, create=True) as role, store_as(dsn, schema, role) as engine_store:
        y = store.enqueue(Job("h", {"n": "y"})).id
        same_end(dsn, schema, [y], like=x)
        z = store.enqueue(Job("h", {"n": "z"})).id
        ended(dsn, schema, [z], "done")  # today's
        failed = _passes(lambda: engine_store.move_terminal(AFTER, TTL, 10), 5)
        assert where(pool, schema, z) != "job", f"today's job held back; passes failed: {failed}"
        assert failed == [], failed


def test_t1_row_level_security_on_a_day_is_named_never_emptied_silently(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any], caplog: pytest.LogCaptureFixture
) -> None:
    """emptiable was has_table_privilege DELETE and SELECT. On a day with row-level security enabled
    and no policy for the role, DELETE and SELECT see no row and raise nothing: history_keep,
    history_forget and history_empty ran on an empty view of the table, committed, and the day's
    jobs stayed past the ttl for ever (SPEC T1) with nothing logged. A table under row-level
    security is no day of the engine's now: never touched, and named in an error, once (its jobs stay
    until an operator lifts it: docs/operating.md)."""
    x = store.enqueue(Job("h", {"n": "x"})).id
    ended(dsn, schema, [x], "done", days_ago=40)
    assert [i for i, _ in store.move_terminal(AFTER, timedelta(days=100), 10)] == [x]
    table = str(where(pool, schema, x))
    run_sql(dsn, sql.SQL("ALTER TABLE {} ENABLE ROW LEVEL SECURITY").format(sql.Identifier(schema, table)))
    with app_role(dsn, schema) as role, store_as(dsn, schema, role) as engine_store:  # DML grants only
        with caplog.at_level(logging.INFO, logger="brooq_py.history"):
            for _ in range(3):  # three passes of retention, ttl 30 days
                engine_store.delete_terminal(TTL, 100)
                engine_store.drop_history(TTL)
        said = [r.getMessage() for r in caplog.records if r.name == "brooq_py.history"]
        assert [m for m in said if table in m and "row-level security" in m], said
        assert len(said) == 1, said
    run_sql(dsn, sql.SQL("ALTER TABLE {} DISABLE ROW LEVEL SECURITY").format(sql.Identifier(schema, table)))
    store.drop_history(TTL)
    assert store.get(x) is None, "lifted, the day goes at the next pass"


# -- B2 / health: a type of a day's name (no relation: not in pg_class) ------------------------


def test_b2_a_domain_named_as_a_day_fails_every_pass_and_holds_back_every_later_day(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """history_tables.sql reads pg_class only, so a type of a day's name that is no relation (a
    domain, an enum) leaves the day "not made" and creatable: the mover locks that day's rows and
    makes its table, and CREATE TABLE fails (the table's row type: "type … already exists",
    DuplicateObject), which create() does not catch (only DuplicateTable, UniqueViolation,
    LockNotAvailable). move() raises at every pass, and as the batch is the oldest rows first, no
    later day ever moves (the engine stays healthy whatever an operator sets up; a refused day never
    holds back the others)."""
    x = store.enqueue(Job("h", {"n": "x"})).id
    ended(dsn, schema, [x], "done", days_ago=2)
    run_sql(dsn, sql.SQL("CREATE DOMAIN {} AS integer").format(_table(schema, day_of(pool, schema, x))))
    z = store.enqueue(Job("h", {"n": "z"})).id
    ended(dsn, schema, [z], "done")  # today's
    failed = _passes(lambda: move(store), 5)
    assert where(pool, schema, x) == "job"
    assert where(pool, schema, z) != "job", f"today's job held back; passes failed: {failed}"
    assert failed == [], failed


# -- T1: the mover moves jobs into a day it can never remove them from ---------------------------


def test_t1_the_mover_moves_jobs_into_a_day_it_may_write_but_never_drop_nor_empty(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """history_lock.sql took the rows of every day ours and writable (INSERT, SELECT), whether or
    not the role may later drop or empty it. An engine whose role may write a day made by another
    role but not delete from it (a grant of SELECT, INSERT) moves that day's jobs there; past the
    ttl the day is "stuck" (neither owned nor emptiable) and the jobs stay for ever, where in job
    retention would have deleted them at the ttl (SPEC T1). The same role's own retention (delete,
    drop) is all that runs here: its own move took the jobs out of its reach."""
    with app_role(dsn, schema, owner=True, create=True) as role, store_as(dsn, schema, role) as engine_store:
        x = store.enqueue(Job("h", {"n": "x"})).id
        ended(dsn, schema, [x], "done", days_ago=40)
        assert [i for i, _ in store.move_terminal(AFTER, timedelta(days=100), 10)] == [x]
        table = str(where(pool, schema, x))
        foreign_day(dsn, schema, table)  # another role's day
        run_sql(
            dsn,
            sql.SQL("GRANT SELECT, INSERT ON {} TO {}").format(
                sql.Identifier(schema, table), sql.Identifier(role)
            ),
        )
        y = store.enqueue(Job("h", {"n": "y"})).id
        same_end(dsn, schema, [y], like=x)
        # the ttl 100 days (40 days ago, as the clock goes: the day then recent): not moved there
        assert engine_store.move_terminal(AFTER, timedelta(days=100), 10) == []
        for _ in range(3):  # its retention, ttl 30 days
            engine_store.delete_terminal(TTL, 100)
            engine_store.drop_history(TTL)
        assert store.get(y) is None, f"y, 40 days old, outlives the ttl of 30 in {where(pool, schema, y)}"


# -- T1: members of the role that owns job (per-instance roles) --------------------------------


def test_t1_an_engine_running_as_a_member_of_the_owner_of_job_may_not_remove_a_day_another_made(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """docs/operating.md: "Run the engines as the owner of job to have the history". Two engines,
    each as its own member of the role that owns job (INHERIT: creatable is true for both). A day
    is made by CREATE TABLE as the session's role, so it belongs to the member that made it, not to
    the owner of job, and no other member may write, drop or empty it. Once the engine that made it
    is gone (its instance retired, its credentials rotated), the other engine keeps the day past the
    ttl for ever (SPEC T1), though it runs as the owner of job as documented."""
    with (
        owner_group(dsn, schema, 2) as (a, b),
        store_as(dsn, schema, a) as one,
        store_as(dsn, schema, b) as two,
    ):
        x = store.enqueue(Job("h", {"n": "x"})).id
        ended(dsn, schema, [x], "done", days_ago=40)
        assert [i for i, _ in one.move_terminal(AFTER, timedelta(days=100), 10)] == [x]  # the day is a's
        for _ in range(3):  # b's retention, ttl 30 days; a's engine is gone
            two.delete_terminal(TTL, 100)
            two.drop_history(TTL)
        assert store.get(x) is None, f"x, 40 days old, outlives the ttl of 30 in {where(pool, schema, x)}"


# -- T1: a day whose DROP fails (a view an operator made on it) -----------------------------------


def test_t1_a_day_an_operator_made_a_view_on_is_never_removed_and_warned_at_every_pass(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any], caplog: pytest.LogCaptureFixture
) -> None:
    """A view on a day's table (a report on yesterday's failures) makes its DROP TABLE fail
    (DependentObjectsStillExist). drop() logs a warning and leaves the day "for the next pass", at
    every pass (no once-while-it-lasts), and never falls back to emptying it (history_empty, which
    the role may do: it owns it): the day's jobs outlive the ttl for ever (SPEC T1)."""
    x = store.enqueue(Job("h", {"n": "x"})).id
    ended(dsn, schema, [x], "done", days_ago=40)
    assert [i for i, _ in store.move_terminal(AFTER, timedelta(days=100), 10)] == [x]
    table = str(where(pool, schema, x))
    run_sql(
        dsn,
        sql.SQL("CREATE VIEW {} AS SELECT id, last_error FROM {} WHERE state = 'dead'").format(
            sql.Identifier(schema, "report"), sql.Identifier(schema, table)
        ),
    )
    with caplog.at_level(logging.WARNING, logger="brooq_py.history"):
        for _ in range(3):
            store.drop_history(TTL)
    said = [r.getMessage() for r in caplog.records if r.name == "brooq_py.history"]
    assert len(said) <= 1, said
    assert store.get(x) is None, f"x, 40 days old, outlives the ttl of 30 in {where(pool, schema, x)}"

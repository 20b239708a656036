"""Third review of "History: pg_catalog's functions alone in the history's transactions; no day with
a trigger, rule or constraint of its own; a move that puts fewer rows than it took rolls back; the
mark moves once the batch committed" (SPEC B2, B3, T1). Each test here fails on 1c02c79 for the
reason its docstring gives."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.postgres import Store
from brooq_py.queue import Job
from tests.integration.history import (
    app_role,
    attacker,
    day_of,
    ended,
    move,
    privileges_on_job,
    run_sql,
    run_sql_as,
    store_as,
    where,
)

# -- helpers ------------------------------------------------------------------------------------


def _table(schema: str, day: str) -> sql.Identifier:
    return sql.Identifier(schema, f"job_history_{day}")


def _count(dsn: str, statement: sql.Composable, params: Any = None) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return int(conn.execute(statement, params).fetchone()[0])  # type: ignore[index]


# -- (1) the scope: a history statement outside a scoped transaction ----------------------------


def test_b2_store_retry_of_a_moved_job_runs_an_operator_of_another_roles_making(
    dsn: str, schema: str, store: Store
) -> None:
    """Rule: no new privilege surface (no other role's code run as the engine). history_scope.sql
    scopes the mover's and the drop's transactions, but job_history_back.sql -- run by Store.retry of
    a job that moved to history (the engine's Store, the CLI's and the dashboard's `retry`) -- is not
    scoped, and it compares `j.tableoid <> to_regclass(...)`: oid <> regclass. pg_catalog has only
    <>(oid, oid) (regclass coerced), so an <>(oid, regclass) in any schema on the search_path is an
    exact match and wins. A role with CREATE on the job table's schema and no right on its tables
    makes that operator; the owner of job retrying a moved dead job runs it: here it grants the
    stranger every right on job."""
    with app_role(dsn, schema, owner=True, create=True) as owner, attacker(dsn, schema) as x:
        a = store.enqueue(Job("h", {})).id
        ended(dsn, schema, [a], "dead")
        assert [i for i, _ in move(store)] == [a]
        grant = f'GRANT ALL ON "{schema}".job TO "{x}"'.replace("'", "''")
        body = f"BEGIN EXECUTE '{grant}'; RETURN $1 OPERATOR(pg_catalog.<>) $2::oid; END"
        run_sql_as(
            dsn,
            x,
            sql.SQL("CREATE FUNCTION {}(oid, regclass) RETURNS boolean LANGUAGE plpgsql AS {}").format(
                sql.Identifier(schema, "oid_ne"), sql.Literal(body)
            ),
        )
        run_sql_as(
            dsn,
            x,
            sql.SQL("CREATE OPERATOR {}.<> (leftarg = oid, rightarg = regclass, function = {})").format(
                sql.Identifier(schema), sql.Identifier(schema, "oid_ne")
            ),
        )
        assert privileges_on_job(dsn, schema, x) == []
        with store_as(dsn, schema, owner, f"-c search_path={schema}") as engine:
            assert engine.retry(a)
        assert privileges_on_job(dsn, schema, x) == [], f"{x} was granted {privileges_on_job(dsn, schema, x)}"


# -- (3) what the catalog's look does not see: a day's own children, a deferred key --------------


def test_b2_a_table_named_as_a_day_inheriting_a_day_is_written_by_the_drop(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """Rule: a table of a day's name not ours is never written, emptied, dropped. history_tables.sql
    calls a table "ours" from its own catalog rows; it never asks whether a day has children of its
    own. The owner of job makes job_history_19990101 INHERITS a day of ours (it is a child of the
    day, not of job: not ours, logged as a stranger, never moved into) and puts in it a done parent
    whose child is still active. When the day is past the ttl, history_keep.sql's
    `DELETE FROM {history} j` (no ONLY) reads the stranger through the day, deletes the parent from
    it and writes it into job; history_forget.sql's `USING {history}` and its count read it too
    (the drop reports the stranger's jobs as dropped and deletes their edges, steps and signals);
    DROP TABLE then fails on the dependent stranger and the day is emptied (ONLY) instead."""
    a = store.enqueue(Job("h", {})).id
    ended(dsn, schema, [a], "done", days_ago=2)
    assert [i for i, _ in move(store)] == [a]
    day = day_of(pool, schema, a)
    parent = store.enqueue(Job("p", {})).id
    child = store.enqueue(Job("c", {}, after=[parent])).id
    ended(dsn, schema, [parent], "done", days_ago=2)
    assert store.get(child).state not in ("done", "dead", "canceled")
    s = _table(schema, "19990101")
    run_sql(dsn, sql.SQL("CREATE TABLE {} () INHERITS ({})").format(s, _table(schema, day)))
    run_sql(
        dsn,
        sql.SQL(
            "WITH m AS (DELETE FROM ONLY {} WHERE id = %s RETURNING *) INSERT INTO {} SELECT * FROM m"
        ).format(sql.Identifier(schema, "job"), s),
        (parent,),
    )
    assert where(pool, schema, parent) == "job_history_19990101"
    store.drop_history(timedelta(days=1))
    assert where(pool, schema, parent) == "job_history_19990101", (
        f"the stranger job_history_19990101 was written: its row is now in {where(pool, schema, parent)}"
    )


def test_b2_a_day_with_a_deferred_primary_key_fails_every_pass_and_holds_back_every_later_row(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """Rules: the engine stays healthy (no pass failing every time) whatever tables an operator sets
    up; a refused day never holds back other days. history_tables.sql compares a day's own
    constraints as ['c job_history_keyless', 'c job_history_terminal', 'p']: a primary key, any
    name, any deferrability. An operator who remade the day's key DEFERRABLE INITIALLY DEFERRED
    (its enforcing trigger is internal: not seen either) leaves it "ours". A row the day holds already
    (module docstring: "an id it holds already", the case the row-by-row path exists for) is then
    refused at COMMIT, not by history_move's statement: the savepoints all pass, the batch's commit
    fails, the mark stays, and every later pass takes the same batch and fails the same way: no row
    of any day moved again. (Now a day with a deferrable constraint is no day of ours.)"""
    a = store.enqueue(Job("h", {})).id
    ended(dsn, schema, [a], "done")
    assert [i for i, _ in move(store)] == [a]
    day = day_of(pool, schema, a)
    t = _table(schema, day)
    pkey = _count(
        dsn,
        sql.SQL("SELECT count(*) FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'p'"),
        (t.as_string(None),),
    )
    assert pkey == 1
    with psycopg.connect(dsn, autocommit=True) as conn:
        (name,) = conn.execute(
            "SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'p'",
            (t.as_string(None),),
        ).fetchone()  # type: ignore[misc]
        conn.execute(sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(t, sql.Identifier(name)))
        conn.execute(sql.SQL("ALTER TABLE {} ADD PRIMARY KEY (id) DEFERRABLE INITIALLY DEFERRED").format(t))
    b, c = store.enqueue(Job("h", {})).id, store.enqueue(Job("h", {})).id
    ended(dsn, schema, [b], "done")
    ended(dsn, schema, [c], "done")
    # the day holds b's id already (the refusal the row-by-row path is for)
    run_sql(
        dsn,
        sql.SQL("INSERT INTO {} SELECT * FROM ONLY {} WHERE id = %s").format(
            t, sql.Identifier(schema, "job")
        ),
        (b,),
    )
    failed = []
    moved: list[str] = []
    for _ in range(3):
        try:
            moved += [i for i, _ in move(store)]
        except Exception as exc:  # a retention pass failing: the Ticker logs it and comes again
            failed.append(f"{type(exc).__name__}: {exc}".splitlines()[0])
    assert not failed, f"passes failed: {failed}; moved: {moved}"
    # a day whose key is deferrable is no day of ours now: its jobs stay in job, and nothing fails
    assert where(pool, schema, c) == "job" and where(pool, schema, b) == "job"

"""Second review of "History: what review found in the catalog's look, fixed" (SPEC B2, B3, T1).
Each test here fails on 1864fd8 for the reason its docstring gives."""

from __future__ import annotations

from typing import Any

from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.postgres import Store
from brooq_py.queue import Job
from tests.integration.history import (
    AFTER,
    TTL,
    app_role,
    attacker,
    day_of,
    ended,
    move,
    owner_group,
    privileges_on_job,
    run_sql,
    run_sql_as,
    same_end,
    store_as,
    where,
)

# -- helpers ------------------------------------------------------------------------------------


def _table(schema: str, day: str) -> sql.Identifier:
    return sql.Identifier(schema, f"job_history_{day}")


# -- privilege surface: unqualified names resolved on the engine's search_path ------------------


def test_b2_history_own_runs_a_format_of_another_roles_making_as_the_engine(
    dsn: str, schema: str, store: Store
) -> None:
    """Rule: no new privilege surface (the DO block must not let another role run code as someone
    else via search_path). history_own.sql's DO block calls format(...) unqualified with arguments
    (unknown, unknown, name). pg_catalog.format is (text, VARIADIC "any"); a format(text, text,
    name) in any schema on the search_path matches better and is chosen, wherever pg_catalog is.
    A role with CREATE on the job table's schema (nothing on its tables) defines one that answers
    'GRANT ALL ON job TO <itself>'; the DO block EXECUTEs it as the engine's role, a member of the
    owner of job, when the engine makes its next day: the role now reads, rewrites and truncates
    every job."""
    with owner_group(dsn, schema, 1) as (member,), attacker(dsn, schema) as x:
        grant = f'GRANT ALL ON "{schema}".job TO "{x}"'
        run_sql_as(
            dsn,
            x,
            sql.SQL("CREATE FUNCTION {}(text, text, name) RETURNS text LANGUAGE sql AS {}").format(
                sql.Identifier(schema, "format"), sql.Literal("SELECT '" + grant.replace("'", "''") + "'")
            ),
        )
        assert privileges_on_job(dsn, schema, x) == []
        with store_as(dsn, schema, member, f"-c search_path={schema}") as engine:
            a = store.enqueue(Job("h", {})).id
            ended(dsn, schema, [a], "done")
            assert [i for i, _ in engine.move_terminal(AFTER, TTL, 10)] == [a]  # the engine made a day
        assert privileges_on_job(dsn, schema, x) == [], f"{x} was granted {privileges_on_job(dsn, schema, x)}"


def test_b2_history_tables_runs_an_operator_of_another_roles_making_at_every_pass(
    dsn: str, schema: str, store: Store
) -> None:
    """Rule: no new privilege surface. history_tables.sql (run at every retention pass) compares
    text[] with `=` unqualified: pg_catalog has only anyarray = anyarray, so an `=`(text[], text[])
    in any schema on the search_path is an exact match and is chosen over it. A role with CREATE on
    the job table's schema and no right on its tables makes that operator; the next pass of an engine running as the owner of job
    runs its function as the owner: here it grants itself every right on job (it could as well
    drop job). The comparison runs for each child of job named as a day: any day the engines made."""
    with app_role(dsn, schema, owner=True, create=True) as owner, attacker(dsn, schema) as x:
        body = (
            "BEGIN EXECUTE "
            + "'GRANT ALL ON "
            + f'"{schema}".job TO "{x}"'.replace("'", "''")
            + "'"
            + "; RETURN $1::text = $2::text; END"
        )
        run_sql_as(
            dsn,
            x,
            sql.SQL("CREATE FUNCTION {}(text[], text[]) RETURNS boolean LANGUAGE plpgsql AS {}").format(
                sql.Identifier(schema, "arr_eq"), sql.Literal(body)
            ),
        )
        run_sql_as(
            dsn,
            x,
            sql.SQL("CREATE OPERATOR {}.= (leftarg = text[], rightarg = text[], function = {})").format(
                sql.Identifier(schema), sql.Identifier(schema, "arr_eq")
            ),
        )
        a = store.enqueue(Job("h", {})).id
        ended(dsn, schema, [a], "done")
        assert [i for i, _ in move(store)] == [a]  # a day of the engine's, as any engine makes it
        assert privileges_on_job(dsn, schema, x) == []
        with store_as(dsn, schema, owner, f"-c search_path={schema}") as engine:
            engine.drop_history(TTL)  # one retention pass's look at the days
        assert privileges_on_job(dsn, schema, x) == [], f"{x} was granted {privileges_on_job(dsn, schema, x)}"


# -- B2: a day's trigger whose error the mover takes for "the table is gone" --------------------


def test_b2_a_days_trigger_failing_with_undefined_table_holds_back_every_later_day_for_ever(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """Rules: a refused day never holds back other days; a row the day refuses stays in job, the
    rest of the batch moves (docs/operating.md: "a trigger of yours on the day's table"). An audit
    trigger on yesterday's table inserts into a table that was since dropped: each insert into the
    day fails with undefined_table (42P01). _move_day re-raises every UndefinedTable, move() takes
    it for the day's table dropped since the look, rolls the whole batch back and looks again, four
    times, then answers [] with the mark where it was: at every pass the same first batch, the
    refused row first, and today's jobs never move (nothing is logged either)."""
    first = store.enqueue(Job("h", {"n": "first"})).id
    ended(dsn, schema, [first], "done", days_ago=1)
    assert [i for i, _ in move(store)] == [first]
    yesterday = day_of(pool, schema, first)
    run_sql(dsn, sql.SQL("CREATE TABLE {} (id uuid)").format(sql.Identifier(schema, "audit")))
    run_sql(
        dsn,
        sql.SQL(
            "CREATE FUNCTION {f}() RETURNS trigger LANGUAGE plpgsql AS $$"
            " BEGIN INSERT INTO {a} VALUES (NEW.id); RETURN NEW; END $$"
        ).format(f=sql.Identifier(schema, "audit_it"), a=sql.Identifier(schema, "audit")),
    )
    run_sql(
        dsn,
        sql.SQL("CREATE TRIGGER audit BEFORE INSERT ON {} FOR EACH ROW EXECUTE FUNCTION {}()").format(
            _table(schema, yesterday), sql.Identifier(schema, "audit_it")
        ),
    )
    run_sql(dsn, sql.SQL("DROP TABLE {}").format(sql.Identifier(schema, "audit")))  # the audit retired
    x = store.enqueue(Job("h", {"n": "x"})).id
    same_end(dsn, schema, [x], like=first)  # yesterday's: its day refuses it
    today = [store.enqueue(Job("h", {"n": i})).id for i in range(3)]
    ended(dsn, schema, today, "done")
    for _ in range(3):  # three retention passes
        move(store)
    assert where(pool, schema, x) == "job"  # refused, it stays: fine
    assert [where(pool, schema, i) for i in today] != ["job"] * 3, "today's jobs never move"


# -- B2: a row a day's trigger skips (RETURN NULL) is deleted from job and never written ----------


def test_b2_a_row_a_days_trigger_skips_is_lost(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """Rule: no job is ever lost by a move; docs/operating.md: a row a trigger of yours on the
    day's table refuses stays in job. A BEFORE INSERT trigger refuses a row the other way
    PostgreSQL gives it, RETURN NULL (skip the row, no error): history_move.sql's DELETE from job
    has run and its INSERT writes nothing for the row; the statement succeeds, so no savepoint is
    rolled back, and the job is gone from job and from every day (store.get finds nothing)."""
    first = store.enqueue(Job("h", {"n": "first"})).id
    ended(dsn, schema, [first], "done")
    assert [i for i, _ in move(store)] == [first]
    day = day_of(pool, schema, first)
    run_sql(
        dsn,
        sql.SQL(
            "CREATE FUNCTION {f}() RETURNS trigger LANGUAGE plpgsql AS $$"
            " BEGIN IF NEW.state = 'canceled' THEN RETURN NULL; END IF; RETURN NEW; END $$"
        ).format(f=sql.Identifier(schema, "no_canceled")),
    )
    run_sql(
        dsn,
        sql.SQL("CREATE TRIGGER no_canceled BEFORE INSERT ON {} FOR EACH ROW EXECUTE FUNCTION {}()").format(
            _table(schema, day), sql.Identifier(schema, "no_canceled")
        ),
    )
    x = store.enqueue(Job("h", {"n": "x"})).id
    ended(dsn, schema, [x], "canceled")
    move(store)
    assert store.get(x) is not None, "x, canceled a second ago, is in no table"


# -- B2: a day's deferred check fails the whole batch at its commit, past every savepoint ---------


def test_b2_a_days_deferred_constraint_trigger_leaves_the_rest_of_its_batch_in_job_until_the_ttl(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """Rules: a refused day never holds back other days; docs/operating.md: a row a trigger of
    yours on the day's table refuses stays in job, "the rest of the batch moves".
    history_tables.sql's "ours" counts check constraints only (contype 'c'): a constraint trigger
    (contype 't') or a foreign key (contype 'f') leaves a day ours. Made DEFERRABLE INITIALLY
    DEFERRED (an operator's check that a dead job of yesterday was reported), it refuses at the
    COMMIT of the mover's transaction, after every savepoint was released: the whole batch, every
    day's part, rolls back and move() raises. But move() set the mark (the newest end it locked)
    before the commit: the next pass reads from there on, and every row of the failed batch that
    ended before its newest, today's y1 here, stays in job until the ttl (until a day opens)."""
    first = store.enqueue(Job("h", {"n": "first"})).id
    ended(dsn, schema, [first], "done", days_ago=1)
    assert [i for i, _ in move(store)] == [first]
    yesterday = day_of(pool, schema, first)
    run_sql(
        dsn,
        sql.SQL(
            "CREATE FUNCTION {f}() RETURNS trigger LANGUAGE plpgsql AS $$"
            " BEGIN IF NEW.state = 'dead' THEN RAISE EXCEPTION 'dead job % not reported', NEW.id; END IF;"
            " RETURN NULL; END $$"
        ).format(f=sql.Identifier(schema, "reported")),
    )
    run_sql(
        dsn,
        sql.SQL(
            "CREATE CONSTRAINT TRIGGER reported AFTER INSERT ON {} DEFERRABLE INITIALLY DEFERRED"
            " FOR EACH ROW EXECUTE FUNCTION {}()"
        ).format(_table(schema, yesterday), sql.Identifier(schema, "reported")),
    )
    x = store.enqueue(Job("h", {"n": "x"})).id
    run_sql(
        dsn,
        sql.SQL(
            "UPDATE ONLY {j} SET state = 'dead', updated_at = (SELECT updated_at FROM {j} WHERE id = %s)"
            " WHERE id = %s"
        ).format(j=sql.Identifier(schema, "job")),
        (first, x),
    )  # dead, yesterday: its day refuses it
    y1, y2 = (store.enqueue(Job("h", {"n": i})).id for i in range(2))
    ended(dsn, schema, [y1], "done", days_ago=20 / 86400)  # today, 20 s ago
    ended(dsn, schema, [y2], "done")  # today, a second ago
    failed = []
    for _ in range(3):  # three retention passes
        try:
            move(store)
        except Exception as exc:
            failed.append(type(exc).__name__)
    assert store.get(x) is not None
    assert where(pool, schema, y2) != "job"
    assert where(pool, schema, y1) != "job", f"y1 of today stays in job after {failed} and two passes"

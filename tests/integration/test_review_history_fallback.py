"""Review of "engines that do not own job move nothing and stay healthy; no day into a stranger's
table" and "history by default: drop when off, retry whole, metrics" (SPEC B2, T1, Q1). Each test
here failed on the change as reviewed."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.queue import Job
from tests.integration.conftest import q
from tests.integration.history import (
    AFTER,
    TTL,
    app_role,
    day_of,
    days,
    ended,
    foreign_day,
    move,
    run_sql,
    same_end,
    short,
    store_as,
    where,
)
from tests.polling import wait_for

# -- helpers ------------------------------------------------------------------------------------


# -- B2: one day the mover may not write holds back every later day ---------------------------


def test_b2_a_strangers_table_of_one_day_does_not_hold_back_the_moves_of_later_days(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """docs/operating.md: a table of a day's name that is no child of job "is never moved into:
    that day's jobs stay in job". But the mover's batch is the oldest ended rows; while it holds one
    of that day, create() answers False and the whole pass moves nothing, pass after pass, and the
    mark (_since) never passes that day. Every job that ended later stays in job (the hot path)
    until the stranger's day is older than the ttl: up to 30 days with the default."""
    old = store.enqueue(Job("h", {"n": "old"})).id
    ended(dsn, schema, [old], "done", days_ago=2)
    day = day_of(pool, schema, old)
    run_sql(
        dsn,
        sql.SQL("CREATE TABLE {} (LIKE {})").format(
            sql.Identifier(schema, f"job_history_{day}"), sql.Identifier(schema, "job")
        ),
    )
    new = [store.enqueue(Job("h", {"n": i})).id for i in range(3)]
    ended(dsn, schema, new, "done")  # a second ago: today's
    for _ in range(5):  # five passes of the mover
        move(store)
    assert where(pool, schema, old) == "job"  # as documented
    assert [where(pool, schema, i) for i in new] == [f"job_history_{day_of(pool, schema, new[0])}"] * 3


def test_b2_a_day_the_owner_of_job_may_not_write_does_not_hold_back_the_moves_of_later_days(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """An engine that owns job (it may make days) meets a day made by another role (a superuser's
    engine run once, another member of the owning group): its INSERT there is refused, move()
    catches InsufficientPrivilege, warns and returns [] for the whole batch. The batch is the
    oldest rows first and the mark is not advanced, so every pass takes that day's rows again and
    today's jobs, whose table the engine made itself, never leave job."""
    with app_role(dsn, schema, owner=True, create=True) as role, store_as(dsn, schema, role) as engine_store:
        x = store.enqueue(Job("h", {"n": "x"})).id
        ended(dsn, schema, [x], "done", days_ago=2)
        assert [i for i, _ in move(store)] == [x]
        foreign_day(dsn, schema, str(where(pool, schema, x)))  # the other role's day (the test's superuser)
        y = store.enqueue(Job("h", {"n": "y"})).id
        same_end(dsn, schema, [y], like=x)  # ended on that day too, still in job
        z = store.enqueue(Job("h", {"n": "z"})).id
        ended(dsn, schema, [z], "done")  # today's
        for _ in range(5):
            engine_store.move_terminal(AFTER, TTL, 10)
        assert where(pool, schema, z) != "job", "today's job never left job"


def test_b2_a_day_granted_later_moves_at_the_next_pass_and_was_said_once_meanwhile(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any], caplog: pytest.LogCaptureFixture
) -> None:
    """What the role may do with a day is read from the catalog at every pass: a day it may not
    write is passed (said once, however many passes) until an operator grants it, and moves at the
    pass after the grant, without a restart."""
    with app_role(dsn, schema, owner=True, create=True) as role, store_as(dsn, schema, role) as engine_store:
        x = store.enqueue(Job("h", {"n": "x"})).id
        ended(dsn, schema, [x], "done", days_ago=2)
        assert [i for i, _ in move(store)] == [x]
        table = where(pool, schema, x)
        foreign_day(dsn, schema, str(table))  # no grant to *role*
        y = store.enqueue(Job("h", {"n": "y"})).id
        same_end(dsn, schema, [y], like=x)
        with caplog.at_level(logging.WARNING, logger="brooq_py.history"):
            for _ in range(5):
                assert engine_store.move_terminal(AFTER, TTL, 10) == []
        assert where(pool, schema, y) == "job"
        said = [
            r for r in caplog.records if r.name == "brooq_py.history" and "may not write" in r.getMessage()
        ]
        assert len(said) == 1, [r.getMessage() for r in caplog.records]
        run_sql(
            dsn,
            sql.SQL("GRANT INSERT, SELECT, DELETE ON {} TO {}").format(
                sql.Identifier(schema, str(table)), sql.Identifier(role)
            ),
        )
        assert [i for i, _ in engine_store.move_terminal(AFTER, TTL, 10)] == [y]
        assert where(pool, schema, y) == table


# -- T1: one day that may not be dropped keeps every later day ---------------------------------


def test_t1_a_day_the_engine_may_not_drop_does_not_keep_the_days_it_made_itself(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """History.drop catches InsufficientPrivilege and *breaks*: the days after the first refused
    one are never tried. An engine that owns job and made a day itself keeps it (and its jobs)
    forever once an older day made by another role sits before it, past the ttl (SPEC T1)."""
    with app_role(dsn, schema, owner=True, create=True) as role, store_as(dsn, schema, role) as engine_store:
        a = store.enqueue(Job("h", {"n": "a"})).id
        ended(dsn, schema, [a], "done", days_ago=40)
        assert [i for i, _ in store.move_terminal(AFTER, timedelta(days=100), 10)] == [a]
        foreign_day(dsn, schema, str(where(pool, schema, a)))  # another role's day
        b = store.enqueue(Job("h", {"n": "b"})).id
        ended(dsn, schema, [b], "done", days_ago=35)
        assert [i for i, _ in engine_store.move_terminal(AFTER, timedelta(days=100), 10)] == [b]  # its own
        own = f"job_history_{day_of(pool, schema, b)}"
        assert own in [short(t) for t in days(pool, schema)]
        for _ in range(3):  # three passes of retention, ttl 30 days
            engine_store.drop_history(TTL)
        assert own not in [short(t) for t in days(pool, schema)], "its own day past the ttl was kept"
        assert store.get(b) is None


def test_t1_a_move_that_fails_does_not_keep_the_days_past_the_ttl(
    dsn: str,
    schema: str,
    store: Store,
    pool: ConnectionPool[Any],
    engines: Callable[..., Engine],
) -> None:
    """Retention.tick says rows past the ttl "never wait for the moves (nor for a move or a drop
    that fails)", but the drop runs after the moves in the same tick: a move that raises (here a
    day's table made by hand, a child of job with a column of its own, NOT NULL) skips the drop
    of every day, pass after pass, and the days past the ttl stay forever (SPEC T1)."""
    a = store.enqueue(Job("h", {"n": "a"})).id
    ended(dsn, schema, [a], "done", days_ago=40)
    assert [i for i, _ in store.move_terminal(AFTER, timedelta(days=100), 10)] == [a]
    (expired,) = days(pool, schema)
    b = store.enqueue(Job("h", {"n": "b"})).id
    ended(dsn, schema, [b], "done", days_ago=2)
    run_sql(
        dsn,
        sql.SQL("CREATE TABLE {} (note text NOT NULL) INHERITS ({})").format(
            sql.Identifier(schema, f"job_history_{day_of(pool, schema, b)}"), sql.Identifier(schema, "job")
        ),
    )
    marker = store.enqueue(Job("h", {"n": "m"})).id
    ended(dsn, schema, [marker], "done", days_ago=40)  # retention's delete: the tick's first statement
    e = engines(retention_period=0.2)  # the default ttl (30 days) and history (an hour)
    e.register_kind("x", lambda ctx, claim: None)
    e.start()
    wait_for(lambda: store.get(marker) is None, "retention's first pass (its delete)", 60)
    wait_for(lambda: expired not in days(pool, schema), "the day past the ttl to be dropped", 30)


def test_t1_an_engine_that_may_not_drop_a_day_still_removes_its_jobs_at_the_ttl(
    dsn: str,
    schema: str,
    store: Store,
    pool: ConnectionPool[Any],
    engines: Callable[..., Engine],
) -> None:
    """SPEC T1: a day made while the engines ran as the owner of job (before the switch to an
    application role with DML grants only) still loses its jobs at the ttl: this role may not drop
    it, but may delete its rows, and does (the empty table stays for its owner to drop)."""
    a = store.enqueue(Job("h", {"n": "a"})).id
    ended(dsn, schema, [a], "done", days_ago=40)
    assert [i for i, _ in store.move_terminal(AFTER, timedelta(days=100), 10)] == [a]  # the owner's day
    marker = store.enqueue(Job("h", {"n": "m"})).id
    ended(dsn, schema, [marker], "done", days_ago=40)  # past the ttl, in job
    with app_role(dsn, schema, create=True) as role, store_as(dsn, schema, role) as app:
        e = engines(app, retention_period=0.2)  # the default ttl (30 days) and history (an hour)
        e.register_kind("x", lambda ctx, claim: None)
        e.start()
        wait_for(lambda: store.get(marker) is None, "retention's first pass (its delete)", 60)
        try:
            wait_for(lambda: store.get(a) is None, "the job ended 40 days ago to be removed", 30)
        finally:
            e.stop(timeout=2)


@pytest.mark.parametrize("made_by", ["the-engines-role", "another-role"])
def test_b2_the_mover_leaves_a_strangers_table_as_it_was_and_names_it(
    dsn: str,
    schema: str,
    store: Store,
    pool: ConnectionPool[Any],
    caplog: pytest.LogCaptureFixture,
    made_by: str,
) -> None:
    """docs/operating.md: a table of a day's name that is no child of job ("made by hand, or by
    another role with CREATE on the schema") "is never moved into: that day's jobs stay in job, and
    the mover logs an error naming the table". create() runs history_index before it looks: on a
    table the engine's role owns it adds an index to it; on another role's it fails with
    InsufficientPrivilege, which move() reports as the not-owner warning ("run the engines as the
    owner of job", which they are), and the documented error is never logged."""
    job_id = store.enqueue(Job("h", {"n": 1})).id
    ended(dsn, schema, [job_id], "done")
    table = f"job_history_{day_of(pool, schema, job_id)}"
    with contextlib.ExitStack() as stack:
        mover = store  # the test's role made the table
        if made_by == "another-role":  # the engine's role owns job; the test's role made the table
            role = stack.enter_context(app_role(dsn, schema, owner=True, create=True))
            mover = stack.enter_context(store_as(dsn, schema, role))
        run_sql(
            dsn,
            sql.SQL("CREATE TABLE {} (LIKE {})").format(
                sql.Identifier(schema, table), sql.Identifier(schema, "job")
            ),
        )
        with caplog.at_level(logging.INFO, logger="brooq_py.history"):
            assert move(mover) == []
        assert where(pool, schema, job_id) == "job"
        indexes = q(
            pool, schema, "SELECT count(*) FROM pg_index WHERE indrelid = %s::regclass", f'"{schema}".{table}'
        )
        assert indexes == [(0,)], "the mover indexed a stranger's table"
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR and table in r.getMessage()]
        assert errors, f"no error naming {table}: {[r.getMessage() for r in caplog.records]}"


def test_b2_an_engine_that_may_not_make_days_says_so_without_a_line_every_pass(
    dsn: str, schema: str, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """The not-owner warning is logged on every pass, unthrottled (a retention_period of a second
    logs it 86,400 times a day; twice a pass once a day made earlier is past the ttl), where the
    engine's own rule for a failure that repeats (Ticker.worth_logging) logs the 1st, 5th, 50th and
    every 500th. Lower severity: the docs say "each retention pass logs a warning"."""
    job_id = store.enqueue(Job("h", {"n": 1})).id
    ended(dsn, schema, [job_id], "done")
    with (
        app_role(dsn, schema, create=True) as role,
        store_as(dsn, schema, role) as app,
        caplog.at_level(logging.WARNING, logger="brooq_py.history"),
    ):
        for _ in range(20):  # twenty passes of the mover
            assert app.move_terminal(AFTER, TTL, 10) == []
    warnings = [r for r in caplog.records if r.name == "brooq_py.history" and r.levelno == logging.WARNING]
    assert 1 <= len(warnings) <= 2, f"{len(warnings)} warnings in 20 passes"


def test_b2_a_table_named_as_no_date_breaks_no_pass(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """Any role with CREATE on the schema may make job_history_20261399: the catalog's look reads
    every table of a day's name, and must not fail on one whose name is no date."""
    run_sql(
        dsn,
        sql.SQL("CREATE TABLE {} (LIKE {})").format(
            sql.Identifier(schema, "job_history_20261399"), sql.Identifier(schema, "job")
        ),
    )
    old = store.enqueue(Job("h", {"n": "old"})).id
    ended(dsn, schema, [old], "done", days_ago=40)
    assert [i for i, _ in store.move_terminal(AFTER, timedelta(days=100), 10)] == [old]
    store.drop_history(TTL)
    assert store.get(old) is None
    j = store.enqueue(Job("h", {"n": "j"})).id
    ended(dsn, schema, [j], "done")
    assert [i for i, _ in move(store)] == [j]

"""Terminal history where a move or a drop meets another transaction (SPEC B2 with D1, D4, Q1, T1):
a move committed while an enqueue or a retry waits for the row, a drop while a reader or a
caller's open transaction holds the day's table. On real PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.postgres import Store
from brooq_py.queue import Job, State
from tests.integration.marks import blocked_by, in_thread
from tests.integration.test_history import TTL, days, ended, where
from tests.polling import wait_for


@pytest.fixture
def day_table(dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]) -> str:
    """Today's table of history, made by a move of a job ended a second ago."""
    first = store.enqueue(Job("h", {})).id
    ended(dsn, schema, [first], "done")
    assert store.move_terminal(timedelta(seconds=0.5), TTL, 10)
    (table,) = days(pool, schema)
    return table


@pytest.fixture
def mover(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection that moves rows by hand, as history_move.sql does, in a transaction left open."""
    with psycopg.connect(dsn) as conn:
        yield conn


def move_open(conn: psycopg.Connection[Any], schema: str, table: str, job_id: str) -> None:
    conn.execute(
        sql.SQL(
            "WITH m AS (DELETE FROM ONLY {} WHERE id = %s RETURNING *) INSERT INTO {} SELECT * FROM m"
        ).format(sql.Identifier(schema, "job"), sql.SQL(table)),
        (job_id,),
    )


def test_b2_d1_an_enqueue_waiting_for_a_parent_that_moves_meanwhile_finds_it_in_history(
    dsn: str,
    schema: str,
    store: Store,
    pool: ConnectionPool[Any],
    day_table: str,
    mover: psycopg.Connection[Any],
) -> None:
    parent = store.enqueue(Job("h", {})).id
    ended(dsn, schema, [parent], "done")
    move_open(mover, schema, day_table, parent)  # the parent's row is locked by the move
    t, out, errors = in_thread(lambda: store.enqueue(Job("c", {}, after=[parent])).id)
    wait_for(lambda: blocked_by(dsn, mover.info.backend_pid) > 0, "the enqueue to wait for the parent", 30)
    mover.commit()
    t.join(30)
    assert not errors, errors
    child = store.get(out[0])
    assert child is not None and child.state is State.PENDING
    assert where(pool, schema, parent) == day_table.split(".")[-1].strip('"')


def test_b2_q1_a_retry_waiting_for_a_row_that_moves_meanwhile_retries_it_from_history(
    dsn: str,
    schema: str,
    store: Store,
    pool: ConnectionPool[Any],
    day_table: str,
    mover: psycopg.Connection[Any],
) -> None:
    job_id = store.enqueue(Job("h", {})).id
    ended(dsn, schema, [job_id], "dead")
    move_open(mover, schema, day_table, job_id)
    t, out, errors = in_thread(lambda: store.retry(job_id))
    wait_for(lambda: blocked_by(dsn, mover.info.backend_pid) > 0, "the retry to wait for the row", 30)
    mover.commit()
    t.join(30)
    assert not errors, errors
    assert out == [True]
    row = store.get(job_id)
    assert row is not None and row.state is State.PENDING
    assert where(pool, schema, job_id) == "job"


def test_b2_t1_a_drop_gives_way_to_a_reader_of_job_and_drops_at_the_next_pass(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    old = store.enqueue(Job("h", {})).id
    ended(dsn, schema, [old], "done", days_ago=15)
    assert store.move_terminal(timedelta(seconds=0.5), TTL, 10)
    with psycopg.connect(dsn) as reader:
        reader.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        reader.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "job")))
        assert store.drop_history(timedelta(days=10)) == []  # it waited a second, then gave way
        assert store.get(old) is not None
        (n,) = reader.execute(
            sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "job"))
        ).fetchone() or (0,)
        assert n == 1  # the reader's snapshot still reads it
    assert [d for d, _ in store.drop_history(timedelta(days=10))] and store.get(old) is None
    assert days(pool, schema) == []


def test_b2_d4_a_caller_naming_a_parent_in_a_day_being_dropped_keeps_it(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """The caller's open transaction names a parent of a day older than the ttl: the drop waits
    for it (and gives way); once it commits, the drop keeps the parent, whose child is active."""
    parent = store.enqueue(Job("h", {})).id
    ended(dsn, schema, [parent], "done", days_ago=15)
    assert store.move_terminal(timedelta(seconds=0.5), TTL, 10)
    with pool.connection() as conn, conn.transaction():
        child = store.enqueue_tx(conn, Job("c", {}, after=[parent])).id
        assert store.drop_history(timedelta(days=10)) == []
    assert [d for d, _ in store.drop_history(timedelta(days=10))]
    assert where(pool, schema, parent) == "job"
    assert store.parent_results(child) == {parent: None}

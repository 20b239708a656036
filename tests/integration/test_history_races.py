"""Terminal history where a move or a drop meets another transaction (SPEC B2 with D1, D4, Q1, T1):
a move committed while an enqueue or a retry waits for the row, a drop while a reader or a
caller's open transaction holds the day's table. On real PostgreSQL."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.postgres import Store
from brooq_py.queue import Job, State
from tests.integration.history import days, ended, move, move_open, short, where, while_moving


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
    out, errors = while_moving(
        dsn, mover, lambda: store.enqueue(Job("c", {}, after=[parent])).id, "the enqueue"
    )
    assert not errors, errors
    child = store.get(out[0])
    assert child is not None and child.state is State.PENDING
    assert where(pool, schema, parent) == short(day_table)


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
    out, errors = while_moving(dsn, mover, lambda: store.retry(job_id), "the retry")
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
    assert move(store)
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
    assert move(store)
    with pool.connection() as conn, conn.transaction():
        child = store.enqueue_tx(conn, Job("c", {}, after=[parent])).id
        assert store.drop_history(timedelta(days=10)) == []
    assert [d for d, _ in store.drop_history(timedelta(days=10))]
    assert where(pool, schema, parent) == "job"
    assert store.parent_results(child) == {parent: None}

"""SPEC B2 with D1, F2: job_enqueue_after run twice when a parent moved while the statement waited
for its lock. On a capped topic (SPEC F2), in a caller's transaction, with a truly unknown parent."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from brooq_py.postgres import Store
from brooq_py.queue import Job, State
from brooq_py.queue.errors import InvalidJob, QueueFull
from tests.integration.conftest import q
from tests.integration.history import move_open, short, where, while_moving
from tests.integration.test_workflows import finish


def count_topic(pool: ConnectionPool[Any], schema: str, topic: str) -> int:
    return int(q(pool, schema, "SELECT count(*) FROM {job} WHERE topic = %s", topic)[0][0])


def test_b2_capped_child_of_a_parent_moving_meanwhile_is_written_once_within_the_cap(
    dsn: str,
    schema: str,
    store: Store,
    pool: ConnectionPool[Any],
    day_table: str,
    mover: psycopg.Connection[Any],
) -> None:
    store.set_max_depth("capped", 2)
    parent = store.enqueue(Job("p", {})).id
    finish(store, "p")
    move_open(mover, schema, day_table, parent)
    jobs = [Job("capped", {"n": i}, after=[parent]) for i in range(2)]
    out, errors = while_moving(dsn, mover, lambda: store.enqueue_many(jobs), "the enqueue")
    assert not errors, errors
    assert [r.created for r in out[0]] == [True, True]
    assert count_topic(pool, schema, "capped") == 2
    with pytest.raises(QueueFull):
        store.enqueue(Job("capped", {"n": 9}))
    assert count_topic(pool, schema, "capped") == 2
    assert where(pool, schema, parent) == short(day_table)


def test_b2_capped_child_of_a_moving_parent_past_the_cap_is_refused_not_written(
    dsn: str,
    schema: str,
    store: Store,
    pool: ConnectionPool[Any],
    day_table: str,
    mover: psycopg.Connection[Any],
) -> None:
    """The cap fills while the first run waits: the second run must refuse (QueueFull), not
    write past it."""
    store.set_max_depth("capped", 1)
    parent = store.enqueue(Job("p", {})).id
    finish(store, "p")
    move_open(mover, schema, day_table, parent)
    filled = []

    def fill() -> None:  # takes the last place meanwhile
        other = Store(pool, schema=schema)
        filled.append(other.enqueue(Job("capped", {"n": 0})).created)
        other.close()

    child = Job("capped", {"n": 1}, after=[parent])
    out, errors = while_moving(dsn, mover, lambda: store.enqueue(child), "the enqueue", meanwhile=fill)
    assert filled == [True]
    assert len(errors) == 1 and isinstance(errors[0], QueueFull), (out, errors)
    assert count_topic(pool, schema, "capped") == 1


def test_b2_a_truly_unknown_parent_on_a_capped_topic_writes_nothing_and_takes_no_place(
    store: Store, pool: ConnectionPool[Any], schema: str
) -> None:
    store.set_max_depth("capped", 2)
    ghost = "01a24b2e-0000-7000-8000-000000000000"
    real = store.enqueue(Job("p", {})).id
    with pytest.raises(InvalidJob, match=ghost):
        store.enqueue_many([Job("capped", {}, after=[real]), Job("capped", {}, after=[ghost])])
    assert count_topic(pool, schema, "capped") == 0
    assert [r.created for r in store.enqueue_many([Job("capped", {}), Job("capped", {})])] == [True, True]


def test_b2_enqueue_tx_naming_a_parent_moving_meanwhile_in_the_callers_transaction(
    dsn: str,
    schema: str,
    store: Store,
    pool: ConnectionPool[Any],
    day_table: str,
    mover: psycopg.Connection[Any],
) -> None:
    """READ COMMITTED caller: the first run fails softly, the second finds the parent; the
    caller's transaction goes on and commits both its writes."""
    parent = store.enqueue(Job("p", {})).id
    finish(store, "p")
    move_open(mover, schema, day_table, parent)

    def caller() -> tuple[str, str]:
        with pool.connection() as conn, conn.transaction():
            before = store.enqueue_tx(conn, Job("x", {})).id
            child = store.enqueue_tx(conn, Job("c", {}, after=[parent])).id
            return before, child

    out, errors = while_moving(dsn, mover, caller, "the enqueue")
    assert not errors, errors
    before, child = out[0]
    row = store.get(child)
    assert row is not None and row.state is State.PENDING
    assert store.get(before) is not None
    assert store.parent_results(child) == {parent: None}

"""SPEC B2 with D1/D1': a caller's REPEATABLE READ transaction naming a parent that the
mover moves while the transaction is open (workflows.md: "a caller's REPEATABLE READ transaction is
not aborted by the engine's writes to a running parent"; the parent here has ended, but before B2 it
stayed in `job` until the ttl, now it moves after `history_after`)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.postgres import Store
from brooq_py.queue import Job, State
from tests.integration.test_history import TTL, ended, where


def _snapshot(conn: psycopg.Connection[Any], schema: str) -> None:
    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "topic_setting")))


@pytest.mark.xfail(
    strict=True,
    raises=psycopg.errors.SerializationFailure,
    reason="known limit (docs/workflows.md): under REPEATABLE READ, naming a parent moved after the "
    "snapshot fails as naming one deleted does; retry the transaction",
)
def test_b2_rr_enqueue_naming_a_parent_moved_after_the_snapshot(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """A SerializationFailure ('could not serialize access due to concurrent delete') aborts the
    caller's transaction, as when retention deleted the parent; the child would be enqueued (the
    parent is done and still exists, in history), as it is when the parent did not move."""
    parent = store.enqueue(Job("h", {})).id
    ended(dsn, schema, [parent], "done")
    with psycopg.connect(dsn) as conn:
        _snapshot(conn, schema)  # the caller's snapshot: the parent is in job
        assert [i for i, _ in store.move_terminal(timedelta(seconds=0.5), TTL, 10)] == [parent]
        assert where(pool, schema, parent) != "job"
        child = store.enqueue_tx(conn, Job("c", {}, after=[parent])).id
        conn.commit()
    row = store.get(child)
    assert row is not None and row.state is State.PENDING


def test_b2_rr_control_parent_not_moved(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """Control: the same transaction, the parent left in job: the enqueue works."""
    parent = store.enqueue(Job("h", {})).id
    ended(dsn, schema, [parent], "done")
    with psycopg.connect(dsn) as conn:
        _snapshot(conn, schema)
        child = store.enqueue_tx(conn, Job("c", {}, after=[parent])).id
        conn.commit()
    row = store.get(child)
    assert row is not None and row.state is State.PENDING


def test_b2_rr_control_parent_in_history_before_the_snapshot(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """Control: the parent moved before the snapshot: the enqueue works."""
    parent = store.enqueue(Job("h", {})).id
    ended(dsn, schema, [parent], "done")
    assert store.move_terminal(timedelta(seconds=0.5), TTL, 10)
    with psycopg.connect(dsn) as conn:
        _snapshot(conn, schema)
        child = store.enqueue_tx(conn, Job("c", {}, after=[parent])).id
        conn.commit()
    row = store.get(child)
    assert row is not None and row.state is State.PENDING
    assert store.parent_results(child) == {parent: None}


@pytest.mark.xfail(
    strict=True,
    raises=psycopg.errors.SerializationFailure,
    reason="known limit (docs/workflows.md): under REPEATABLE READ, naming a parent moved after the "
    "snapshot fails as naming one deleted does; retry the transaction",
)
def test_b2_rr_enqueue_group_naming_a_parent_moved_after_the_snapshot(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """enqueue_group with tx= (a caller's RR transaction) whose jobs name a parent that moved."""
    parent = store.enqueue(Job("h", {})).id
    ended(dsn, schema, [parent], "done")
    with psycopg.connect(dsn) as conn:
        _snapshot(conn, schema)
        assert store.move_terminal(timedelta(seconds=0.5), TTL, 10)
        store.enqueue_group({"a": Job("g", {}, after=[parent])}, then=Job("t", {}), tx=conn)
        conn.commit()

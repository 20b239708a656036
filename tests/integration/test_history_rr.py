"""SPEC B2 with D1/D1': a caller's REPEATABLE READ transaction naming a parent that the
mover moves while the transaction is open (workflows.md: "a caller's REPEATABLE READ transaction is
not aborted by the engine's writes to a running parent"; the parent here has ended, but before B2 it
stayed in `job` until the ttl, now it moves after `history_after`)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.postgres import Store
from brooq_py.queue import Job, State
from tests.integration.history import ended, move, where


def _snapshot(conn: psycopg.Connection[Any], schema: str) -> None:
    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "topic_setting")))


# A known limit (docs/workflows.md): under REPEATABLE READ, naming a parent moved after the snapshot
# fails as naming one deleted does ("could not serialize access due to concurrent delete"): the
# caller's transaction is aborted, to be retried.
RR_LIMIT = pytest.mark.xfail(
    strict=True,
    raises=psycopg.errors.SerializationFailure,
    reason="known limit (docs/workflows.md): under REPEATABLE READ, naming a parent moved after the "
    "snapshot fails as naming one deleted does; retry the transaction",
)


@pytest.mark.parametrize(
    "moved", [pytest.param("after the snapshot", marks=RR_LIMIT), "never", "before the snapshot"]
)
def test_b2_rr_enqueue_naming_a_parent_in_a_repeatable_read_transaction(
    moved: str, dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """The child would be enqueued whenever the parent moved (it is done and still exists, in
    history), as it is when the parent is left in job or moved before the caller's snapshot."""
    parent = store.enqueue(Job("h", {})).id
    ended(dsn, schema, [parent], "done")
    if moved == "before the snapshot":
        assert move(store)
    with psycopg.connect(dsn) as conn:
        _snapshot(conn, schema)  # the caller's snapshot
        if moved == "after the snapshot":
            assert [i for i, _ in move(store)] == [parent]
            assert where(pool, schema, parent) != "job"
        child = store.enqueue_tx(conn, Job("c", {}, after=[parent])).id
        conn.commit()
    row = store.get(child)
    assert row is not None and row.state is State.PENDING
    assert store.parent_results(child) == {parent: None}


@RR_LIMIT
def test_b2_rr_enqueue_group_naming_a_parent_moved_after_the_snapshot(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """enqueue_group with tx= (a caller's RR transaction) whose jobs name a parent that moved."""
    parent = store.enqueue(Job("h", {})).id
    ended(dsn, schema, [parent], "done")
    with psycopg.connect(dsn) as conn:
        _snapshot(conn, schema)
        assert move(store)
        store.enqueue_group({"a": Job("g", {}, after=[parent])}, then=Job("t", {}), tx=conn)
        conn.commit()

"""SPEC B2 with D4, DS1: what other transactions do while a day is being dropped: just before the
drop's transaction (a hook run before History._drop), and between a drop that gave way to a reader
and the next pass. (A first version emptied the day of edges, steps and signals before taking the
table's lock: a child retried in between lost the edge that keeps its parent, and a job retried in
between its recorded steps. The drop now does all of it under the lock, in one transaction.)"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.postgres import Store
from brooq_py.queue import Job, State
from tests.integration.conftest import q
from tests.integration.history import days, ended, move, where
from tests.integration.test_workflows import finish, state

TEN = timedelta(days=10)


@contextmanager
def between_phases(store: Store, hook: Callable[[], None]) -> Iterator[None]:
    """Run *hook* once, after phase 1 of a drop committed and before phase 2 starts."""
    history = store.worker.history
    original = history._drop
    fired: list[int] = []

    def patched(day: str, statement: str) -> Any:
        if not fired:
            fired.append(1)
            hook()
        return original(day, statement)

    history._drop = patched  # type: ignore[method-assign]
    try:
        yield
    finally:
        history._drop = original  # type: ignore[method-assign]
    assert fired, "the hook never ran (no phase 2)"


@contextmanager
def reader(dsn: str, schema: str) -> Iterator[None]:
    """A REPEATABLE READ reader of job holding every day's table: a drop's phase 2 gives way."""
    with psycopg.connect(dsn) as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "job")))
        yield
        conn.rollback()


def edges_of(pool: ConnectionPool[Any], schema: str, job_id: str) -> list[tuple[str, str]]:
    rows = q(
        pool,
        schema,
        f'SELECT parent::text, child::text FROM "{schema}".job_edge WHERE parent = %s OR child = %s',
        job_id,
        job_id,
    )
    return sorted((str(a), str(b)) for a, b in rows)


def old_parent_with_canceled_child(dsn: str, schema: str, store: Store) -> tuple[str, str]:
    """A done parent P moved to a day older than the 10-day ttl; its child C, canceled, in job."""
    parent = store.enqueue(Job("p", {})).id
    finish(store, "p")
    child = store.enqueue(Job("c", {}, after=[parent])).id
    assert state(store, child) is State.PENDING
    assert store.cancel(child)
    ended(dsn, schema, [parent], "done", days_ago=15)
    assert [i for i, _ in move(store)] == [parent]
    return parent, child


# -- an enqueue naming a parent of the day between the phases (expected to hold) --------------


def test_b2_enqueue_between_phases_keeps_the_parent_and_its_new_edge(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    parent = store.enqueue(Job("p", {})).id
    finish(store, "p")
    q(pool, schema, "UPDATE {job} SET result = '7' WHERE id = %s", parent)
    ended(dsn, schema, [parent], "done", days_ago=15)
    assert move(store)
    made: list[str] = []
    with between_phases(store, lambda: made.append(store.enqueue(Job("c", {}, after=[parent])).id)):
        dropped = store.drop_history(TEN)
    assert dropped and dropped[0][1] == {}, dropped
    (child,) = made
    assert where(pool, schema, parent) == "job"
    assert edges_of(pool, schema, parent) == [(parent, child)]
    assert store.parent_results(child) == {parent: 7}


# -- a retry of a child between the phases ------------------------------------------------


def test_b2_child_retried_between_phases_keeps_its_parent(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """P (done, day older than the ttl) and its canceled child C. Phase 1 deletes the edge P->C
    (C is not active). C is retried before phase 2 (P is there, done: job_retry accepts it).
    Phase 2's keep looks for P through job_edge: the edge is gone, so P is dropped while C, which
    names it, is pending. D4: retention keeps a parent while a child naming it is active."""
    parent, child = old_parent_with_canceled_child(dsn, schema, store)
    retried: list[bool] = []
    with between_phases(store, lambda: retried.append(store.retry(child))):
        store.drop_history(TEN)
    assert retried == [True]
    assert state(store, child) is State.PENDING
    assert where(pool, schema, parent) == "job", "the parent of an active child was dropped"
    assert store.parent_results(child) == {parent: None}


def test_b2_child_retried_after_a_drop_gave_way_keeps_its_parent(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """As above, with the gap a whole retention period wide: phase 2 gave way to a reader, the
    day's table stays (its edges already deleted), the child is retried, the next pass drops."""
    parent, child = old_parent_with_canceled_child(dsn, schema, store)
    with reader(dsn, schema):
        assert store.drop_history(TEN) == []  # gave way, after phase 1 committed
    assert edges_of(pool, schema, parent) == [(parent, child)]  # a drop that gave way deleted nothing
    assert store.retry(child)
    store.drop_history(TEN)
    assert where(pool, schema, parent) == "job", "the parent of an active child was dropped"


# -- a retry of a job of the day between the phases: its steps and signals ------------------


def test_b2_job_retried_between_phases_keeps_its_steps_and_signals(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """A dead job with a recorded step and a signal, in a day older than the ttl. Phase 1 deletes
    its steps and signals; a retry before phase 2 takes it back to job and it runs again without
    them (DS1: a retried job replays its recorded steps; test_history_attacks checks that across
    a move)."""
    job_id = store.enqueue(Job("s", {})).id
    with pool.connection() as conn:
        conn.execute(
            sql.SQL("INSERT INTO {} (job_id, seq, name, result) VALUES (%s, 1, 'charge', '1')").format(
                sql.Identifier(schema, "job_step")
            ),
            (job_id,),
        )
        conn.execute(
            sql.SQL("INSERT INTO {} (job_id, name, payload, woke) VALUES (%s, 'go', '1', true)").format(
                sql.Identifier(schema, "job_signal")
            ),
            (job_id,),
        )
    ended(dsn, schema, [job_id], "dead", days_ago=15)
    assert move(store)
    row = store.get(job_id)
    assert row is not None and len(row.steps) == 1
    retried: list[bool] = []
    with between_phases(store, lambda: retried.append(store.retry(job_id))):
        store.drop_history(TEN)
    assert retried == [True]
    row = store.get(job_id)
    assert row is not None and row.state is State.PENDING
    steps = q(pool, schema, f'SELECT count(*) FROM "{schema}".job_step WHERE job_id = %s', job_id)[0][0]
    signals = q(pool, schema, f'SELECT count(*) FROM "{schema}".job_signal WHERE job_id = %s', job_id)[0][0]
    assert (steps, signals) == (1, 1), (
        f"the retried job lost its steps/signals: {steps} steps, {signals} signals"
    )


def test_b2_parent_kept_in_phase2_lost_its_own_edges(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """A parent P kept only by phase 2 (its child enqueued between the phases) had its edges to
    its earlier children deleted by phase 1; one kept by phase 1 keeps them. Recorded, not a
    promise: whether the two keeps leave the same job_edge."""
    parent = store.enqueue(Job("p", {})).id
    finish(store, "p")
    earlier = store.enqueue(Job("c", {}, after=[parent])).id
    finish(store, "c")
    ended(dsn, schema, [parent, earlier], "done", days_ago=15)
    assert len(move(store)) == 2
    made: list[str] = []
    with between_phases(store, lambda: made.append(store.enqueue(Job("c2", {}, after=[parent])).id)):
        store.drop_history(TEN)
    assert where(pool, schema, parent) == "job"
    assert where(pool, schema, earlier) is None
    assert edges_of(pool, schema, parent) == [(parent, made[0])]
    assert days(pool, schema) == []


def test_b2_parent_kept_by_phase2_keeps_its_parent_role_for_an_older_child(
    dsn: str, schema: str, store: Store, pool: ConnectionPool[Any]
) -> None:
    """P (done, old day) has a child E that ended dead, in job. Phase 1 deletes the edge P->E.
    A child C2 enqueued between the phases has phase 2 keep P (back to job), without that edge.
    C2 ends; E is retried (P is there, done: accepted). Retention's row-by-row delete now finds
    no active child of P through job_edge and deletes P while E, naming it, is pending (D4)."""
    parent = store.enqueue(Job("p", {})).id
    finish(store, "p")
    older = store.enqueue(Job("e", {}, after=[parent])).id
    assert finish(store, "e", State.DEAD) == [older]
    ended(dsn, schema, [parent], "done", days_ago=15)
    assert [i for i, _ in move(store)] == [parent]
    made: list[str] = []
    with between_phases(store, lambda: made.append(store.enqueue(Job("c2", {}, after=[parent])).id)):
        store.drop_history(TEN)
    assert where(pool, schema, parent) == "job"
    assert (parent, made[0]) in edges_of(pool, schema, parent)
    assert finish(store, "c2") == made
    assert store.retry(older)
    store.delete_terminal(TEN, 100)
    assert where(pool, schema, parent) == "job", "retention deleted the parent of a pending child"
    assert store.parent_results(older) == {parent: None}

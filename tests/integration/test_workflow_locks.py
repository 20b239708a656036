"""A parent's end never waits on another row's lock, and a child's enqueue never writes its parents
(SPEC O4, D2, D3, D1').

A child row held elsewhere (an operator's open transaction) is released or canceled
by the stager's next statement once the lock is gone; so is a child whose enqueue
overlapped its parent's end.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from brooq_py.engine import Engine
from brooq_py.postgres import Store, WrapTx
from brooq_py.queue import Job, State
from brooq_py.queue.port import Outcome
from tests.integration.test_workflows import state
from tests.polling import wait_for

LEASE = timedelta(seconds=30)
# How long the operator holds the child's row: the outcomes must not wait for it.
HOLD = 8.0
# An outcome batch that does not wait returns well within this, on a busy machine too.
PROMPT = 4.0


@pytest.fixture
def db(dsn: str, schema: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        yield conn


@pytest.fixture
def operator(dsn: str, schema: str) -> Iterator[psycopg.Connection[Any]]:
    """A psql-like session whose transaction holds rows locked until the test rolls it back."""
    with psycopg.connect(dsn) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        conn.commit()
        yield conn
        conn.rollback()


def sweep(store: Store) -> None:
    """What the stager's next tick runs (its topics do not matter to the release)."""
    store.worker.stage(["any"], 1000)


def settle_in_thread(store: Store, outcomes: list[Outcome]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        started = time.monotonic()
        written = store.worker.settle_many(outcomes)
        out.append((written, time.monotonic() - started))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def claimed(store: Store, topic: str, n: int = 100) -> list[Outcome]:
    return [
        Outcome(r.id, r.claim_token, State.DONE, topic=topic)
        for r in store.worker.claim([topic], n, "w", LEASE)
    ]


@pytest.mark.parametrize("end", [State.DONE, State.DEAD])
def test_o4_a_parents_end_and_its_batch_never_wait_for_a_child_locked_elsewhere(
    store: Store, operator: psycopg.Connection[Any], end: State
) -> None:
    parent = store.enqueue(Job("a")).id
    child = store.enqueue(Job("b", after=[parent])).id
    grandchild = store.enqueue(Job("c", after=[child])).id
    others = [store.enqueue(Job("u", {"i": i})).id for i in range(3)]
    (a,) = claimed(store, "a")
    batch = [Outcome(a.id, a.claim_token, end, topic="a"), *claimed(store, "u")]
    operator.execute("SELECT id FROM job WHERE id = %s FOR UPDATE", (child,))
    held_at = time.monotonic()
    t, out = settle_in_thread(store, batch)
    t.join(PROMPT)
    assert out, "the outcome batch waited for the child's row lock"
    written, took = out[0]
    assert written == {parent, *others} and took < PROMPT
    assert time.monotonic() - held_at < HOLD
    assert state(store, parent) is end and {state(store, j) for j in others} == {State.DONE}
    assert state(store, child) is State.BLOCKED  # still held: nothing written to it
    sweep(store)
    assert state(store, child) is State.BLOCKED  # a sweep skips it while the lock is held
    operator.rollback()
    sweep(store)
    row = store.get(child)
    assert row is not None
    if end is State.DONE:
        assert row.state is State.PENDING
        assert state(store, grandchild) is State.BLOCKED
    else:
        assert row.state is State.CANCELED and row.last_error == f"canceled: parent {parent} ended dead"
        assert state(store, grandchild) is State.CANCELED


def test_o4_a_cancel_never_waits_for_a_descendant_locked_elsewhere(
    store: Store, operator: psycopg.Connection[Any]
) -> None:
    parent = store.enqueue(Job("a")).id
    child = store.enqueue(Job("b", after=[parent])).id
    operator.execute("SELECT id FROM job WHERE id = %s FOR UPDATE", (child,))
    done: list[bool] = []
    t = threading.Thread(target=lambda: done.append(store.cancel(parent)), daemon=True)
    t.start()
    t.join(PROMPT)
    assert done == [True], "the cancel waited for its child's row lock"
    operator.rollback()
    sweep(store)
    row = store.get(child)
    assert row is not None and row.state is State.CANCELED
    assert row.last_error == f"canceled: parent {parent} ended canceled"


def test_d2_a_child_is_released_by_the_engines_stager_once_the_lock_is_gone(
    store: Store, operator: psycopg.Connection[Any], engines: Callable[..., Engine]
) -> None:
    engine = engines(poll_interval=0.2)
    engine.register_kind("a", lambda ctx, claim: "a")
    engine.register_kind("b", lambda ctx, claim: "b")
    parent = store.enqueue(Job("a")).id
    child = store.enqueue(Job("b", after=[parent])).id
    operator.execute("SELECT id FROM job WHERE id = %s FOR UPDATE", (child,))
    with engine:
        assert wait_for(lambda: state(store, parent) is State.DONE, "the parent's done")
        assert state(store, child) is State.BLOCKED
        operator.rollback()
        assert wait_for(lambda: state(store, child) is State.DONE, "the child run after the lock went")


def test_d2_a_fan_in_settled_concurrently_never_deadlocks_nor_loses_its_release(store: Store) -> None:
    parents = [store.enqueue(Job("p", {"i": i})).id for i in range(48)]
    child = store.enqueue(Job("join", after=parents)).id
    outcomes = claimed(store, "p")
    assert len(outcomes) == len(parents)
    # eight batches in opposite orders, each its own transaction, all at once
    batches = [outcomes[i::8] if i % 2 else outcomes[i::8][::-1] for i in range(8)]
    go = threading.Barrier(len(batches))
    results: list[set[str]] = []
    errors: list[BaseException] = []

    def run(batch: list[Outcome]) -> None:
        go.wait()
        try:
            results.append(set(store.worker.settle_many(batch)))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(b,), daemon=True) for b in batches]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == [] and set().union(*results) == set(parents)
    sweep(store)  # a parent that met the child locked by another's done left it to the sweep
    assert state(store, child) is State.PENDING


def test_d1_enqueueing_after_a_running_parent_in_repeatable_read_survives_its_heartbeat(
    store: Store, dsn: str, schema: str, db: psycopg.Connection[Any]
) -> None:
    parent = store.enqueue(Job("a")).id
    store.worker.claim(["a"], 1, "w", LEASE)
    with psycopg.connect(dsn) as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        tx = WrapTx(conn)
        own = store.enqueue_tx(tx, Job("mine")).id  # the caller's own write takes the snapshot
        # the engine's heartbeat rewrites the running parent's row meanwhile
        db.execute(
            "UPDATE job SET locked_until = locked_until + interval '1 second' WHERE id = %s", (parent,)
        )
        version = db.execute("SELECT xmin::text FROM job WHERE id = %s", (parent,)).fetchone()
        child = store.enqueue_tx(tx, Job("b", after=[parent])).id
        conn.commit()
    assert db.execute("SELECT xmin::text FROM job WHERE id = %s", (parent,)).fetchone() == version
    assert state(store, own) is State.PENDING and state(store, child) is State.BLOCKED
    assert store.get(child).parents == (parent,)  # type: ignore[union-attr]


@pytest.mark.parametrize("end", [State.DONE, State.DEAD])
def test_d2_a_child_enqueued_while_its_parent_ended_is_not_left_blocked(
    store: Store, dsn: str, schema: str, end: State
) -> None:
    """The enqueue's snapshot saw the parent running; its end committed before the child did."""
    parent = store.enqueue(Job("a")).id
    (r,) = store.worker.claim(["a"], 1, "w", LEASE)
    with psycopg.connect(dsn) as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        tx = WrapTx(conn)
        store.enqueue_tx(tx, Job("mine"))
        assert store.worker.settle_many([Outcome(r.id, r.claim_token, end)]) == {parent}
        child = store.enqueue_tx(tx, Job("b", after=[parent])).id
        conn.commit()
    assert state(store, child) is State.BLOCKED  # its snapshot saw the parent running
    sweep(store)
    assert state(store, child) is (State.PENDING if end is State.DONE else State.CANCELED)


def test_d2_a_child_enqueued_by_the_previous_release_is_released(
    store: Store, db: psycopg.Connection[Any]
) -> None:
    """The previous release's enqueue inserts the child and its edge and marks the running parent
    (has_children) in one statement; the parent's end releases that child as before."""
    parent = store.enqueue(Job("a")).id
    (r,) = store.worker.claim(["a"], 1, "w", LEASE)
    (child,) = db.execute(
        "WITH c AS (INSERT INTO job (topic, payload, state, parents, waiting_parents) "
        "VALUES ('b', '{}', 'blocked', ARRAY[%(p)s::uuid], 1) RETURNING id), "
        "e AS (INSERT INTO job_edge (parent, child) SELECT %(p)s, id FROM c), "
        "m AS (UPDATE job SET has_children = true WHERE id = %(p)s) "
        "SELECT id::text FROM c",
        {"p": parent},
    ).fetchone() or ("",)
    assert store.worker.settle_many([Outcome(r.id, r.claim_token, State.DONE)]) == {parent}
    assert state(store, child) is State.PENDING


def test_o4_d2_fan_ins_on_two_engines_under_operator_locks_on_their_children_end_done_once(
    store: Store, dsn: str, schema: str, engines: Callable[..., Engine]
) -> None:
    """Six fan-ins (four parents, one child each) drain on two engines while an operator keeps
    locking a blocked child's row for two seconds at a time: every parent ends done (its outcome
    never waits for the child's lock), every child is released once its lock is gone and runs
    once, reading its four parents' results."""
    runs: dict[str, int] = {}
    seen: dict[str, int] = {}
    lock = threading.Lock()

    def parent(ctx: Any, claim: Any) -> int:
        time.sleep(0.05 * (claim.payload["n"] % 4))
        return int(claim.payload["n"])

    def child(ctx: Any, claim: Any) -> None:
        with lock:
            runs[claim.id] = runs.get(claim.id, 0) + 1
            seen[claim.id] = len(claim.parent_results())

    es = [engines(workers=3, lease=3, reaper_period=0.3), engines(workers=3, lease=3, reaper_period=0.3)]
    for e in es:
        e.register_kind("wf.parent", parent)
        e.register_kind("wf.child", child)
    children = []
    for g in range(6):
        group = store.enqueue_group(
            [Job("wf.parent", {"n": 4 * g + i}) for i in range(4)], then=Job("wf.child")
        )
        assert group.then_id is not None
        children.append(group.then_id)
    stop = threading.Event()
    locks = [0]

    def operate() -> None:
        with psycopg.connect(dsn) as conn:
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            conn.commit()
            while not stop.is_set():
                row = conn.execute(
                    "SELECT id FROM job WHERE topic = 'wf.child' AND state = 'blocked' ORDER BY random() LIMIT 1"
                ).fetchone()
                if row is not None:
                    conn.execute("SELECT 1 FROM job WHERE id = %s FOR UPDATE", (row[0],))
                    locks[0] += 1
                    stop.wait(2.0)
                conn.rollback()
                stop.wait(0.05)

    op = threading.Thread(target=operate, daemon=True)
    op.start()
    for e in es:
        e.start()
    try:
        wait_for(lambda: all(state(store, c) is State.DONE for c in children), "every child done", timeout=90)
    finally:
        stop.set()
        op.join(10)
    assert locks[0] >= 1, "the operator never held a child"
    assert runs == {c: 1 for c in children} and seen == {c: 4 for c in children}
    parents_done = store.list_jobs(topic="wf.parent", state="done", limit=100)
    assert len(parents_done) == 24

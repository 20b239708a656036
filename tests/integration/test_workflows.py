"""Workflows on the real PostgreSQL store: parents, blocked jobs, release, cancel cascade (SPEC D1-D4, D6)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.postgres import Store
from brooq_py.queue import InvalidJob, Job, QueueFull, State
from brooq_py.queue.port import Outcome

LEASE = timedelta(seconds=30)


@pytest.fixture
def db(dsn: str, schema: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        yield conn


def state(store: Store, job_id: str) -> State:
    row = store.get(job_id)
    assert row is not None, job_id
    return row.state


def waiting(db: psycopg.Connection[Any], job_id: str) -> int:
    row = db.execute("SELECT waiting_parents FROM job WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return int(row[0])


def edges(db: psycopg.Connection[Any]) -> set[tuple[str, str]]:
    return {(str(p), str(c)) for p, c in db.execute("SELECT parent, child FROM job_edge").fetchall()}


def finish(store: Store, topic: str, outcome: State = State.DONE, n: int = 1000) -> list[str]:
    """Claim every ready job of *topic* and write *outcome* for all of them in one outcome batch."""
    rows = store.worker.claim([topic], n, "test", LEASE)
    written = store.worker.settle_many([Outcome(r.id, r.claim_token, outcome, topic=topic) for r in rows])
    assert written == {r.id for r in rows}
    return [r.id for r in rows]


# -- D1: enqueue --------------------------------------------------------------------------


def test_d1_parents_enqueued_earlier_in_the_same_transaction_count(
    store: Store, db: psycopg.Connection[Any]
) -> None:
    with store.begin() as tx:
        a = store.enqueue_tx(tx, Job("a")).id
        b = store.enqueue_tx(tx, Job("b")).id
        done_before = store.enqueue_tx(tx, Job("c")).id
        child = store.enqueue_tx(tx, Job("child", {"n": 1}, after=[a, b, a])).id
        row = store.get_tx(tx, child)
        assert row is not None and row.state is State.BLOCKED and row.parents == (a, b)
        assert store.get(child) is None  # nothing visible before commit
    assert waiting(db, child) == 2
    assert edges(db) == {(a, child), (b, child)}
    assert done_before  # a plain job in the same transaction is untouched
    # a batch mixing jobs with and without parents, in the caller's transaction
    with store.begin() as tx:
        results = store.enqueue_many([Job("m"), Job("m", after=[a]), Job("m", after=[child, b])], tx=tx)
    assert [state(store, r.id) for r in results] == [State.PENDING, State.BLOCKED, State.BLOCKED]
    assert waiting(db, results[2].id) == 2


def test_d1_a_rolled_back_transaction_leaves_no_graph(store: Store, db: psycopg.Connection[Any]) -> None:
    parent = store.enqueue(Job("p")).id

    class Boom(Exception):
        pass

    with pytest.raises(Boom), store.begin() as tx:
        inner = store.enqueue_tx(tx, Job("q")).id
        store.enqueue_tx(tx, Job("c", after=[parent, inner]))
        store.enqueue_group([Job("g"), Job("g")], then=Job("t"), tx=tx)
        raise Boom
    assert db.execute("SELECT id::text FROM job").fetchall() == [(parent,)]
    assert edges(db) == set()
    assert db.execute("SELECT has_children FROM job WHERE id = %s", (parent,)).fetchone() == (False,)


def test_d1_an_unknown_parent_is_invalid_and_the_transaction_stays_usable(
    store: Store, db: psycopg.Connection[Any]
) -> None:
    real = store.enqueue(Job("p")).id
    missing = str(uuid.uuid4())
    with store.begin() as tx:
        kept = store.enqueue_tx(tx, Job("x")).id
        with pytest.raises(InvalidJob, match=missing):
            store.enqueue_tx(tx, Job("c", after=[real, missing]))
        with pytest.raises(InvalidJob, match=missing):
            store.enqueue_many([Job("c"), Job("c", after=[missing])], tx=tx)
        with pytest.raises(InvalidJob, match=missing):
            store.enqueue_group([Job("g")], then=Job("t", after=[missing]), tx=tx)
        after_refusal = store.enqueue_tx(tx, Job("y", after=[real])).id  # the transaction still works
    with pytest.raises(InvalidJob, match="not a job id"):
        store.enqueue(Job("c", after=["not-a-uuid"]))  # refused before any statement
    with pytest.raises(InvalidJob, match=missing):
        store.enqueue(Job("c", after=[missing]))
    # A parent committed by another transaction after this one began is visible at READ COMMITTED,
    # one not committed yet is not.
    ids = {str(r[0]): r[1] for r in db.execute("SELECT id, topic FROM job").fetchall()}
    assert ids == {real: "p", kept: "x", after_refusal: "y"}
    assert edges(db) == {(real, after_refusal)}


def test_d1_a_job_whose_parents_are_done_is_pending_at_once(
    store: Store, db: psycopg.Connection[Any]
) -> None:
    p = store.enqueue(Job("p")).id
    finish(store, "p")
    version = db.execute("SELECT xmin::text FROM job WHERE id = %s", (p,)).fetchone()
    now = store.enqueue(Job("c", after=[p])).id
    assert db.execute("SELECT xmin::text FROM job WHERE id = %s", (p,)).fetchone() == version  # never written
    later = store.enqueue(Job("c", after=[p], available_at=datetime.now(UTC) + timedelta(hours=1))).id
    assert state(store, now) is State.PENDING
    assert state(store, later) is State.SCHEDULED
    assert [c.id for c in store.worker.claim(["c"], 10, "w", LEASE)] == [now]


def test_d3_a_child_of_a_dead_or_canceled_parent_is_canceled_at_birth(store: Store) -> None:
    dead = store.enqueue(Job("p")).id
    finish(store, "p", State.DEAD)
    canceled = store.enqueue(Job("q")).id
    assert store.cancel(canceled)
    alive = store.enqueue(Job("r")).id
    child = store.enqueue(Job("c", after=[alive, dead])).id
    row = store.get(child)
    assert row is not None and row.state is State.CANCELED
    assert row.last_error == f"canceled: parent {dead} ended dead"
    other = store.get(store.enqueue(Job("c", after=[canceled])).id)
    assert other is not None and other.last_error == f"canceled: parent {canceled} ended canceled"


def test_d1_keyed_child_already_there_adds_no_edges(store: Store, db: psycopg.Connection[Any]) -> None:
    p1 = store.enqueue(Job("p")).id
    p2 = store.enqueue(Job("p")).id
    first = store.enqueue(Job("c", idempotency_key="k", after=[p1]))
    again = store.enqueue(Job("c", idempotency_key="k", after=[p2]))
    assert again == (first.id, False)
    assert edges(db) == {(p1, first.id)}
    # A cycle cannot be made through a key: the existing job gains no parent, its child stays its child.
    grandchild = store.enqueue(Job("g", after=[first.id])).id
    assert store.enqueue(Job("c", idempotency_key="k", after=[grandchild])) == (first.id, False)
    assert edges(db) == {(p1, first.id), (first.id, grandchild)}
    row = store.get(first.id)
    assert row is not None and row.parents == (p1,)


def test_d2_any_update_to_done_releases_children(store: Store, db: psycopg.Connection[Any]) -> None:
    """The release is the database's: a settle of the previous release's code, or psql, releases too."""
    p = store.enqueue(Job("p")).id
    child = store.enqueue(Job("c", after=[p])).id
    db.execute(
        "UPDATE job SET state = 'processing', locked_by = 'old', locked_until = now() WHERE id = %s", (p,)
    )
    assert state(store, child) is State.BLOCKED
    db.execute(
        "UPDATE job SET state = 'done', updated_at = now() WHERE id = %s AND state = 'processing'", (p,)
    )
    assert state(store, child) is State.PENDING


# -- D2: release ---------------------------------------------------------------------------


def test_d2_the_last_parents_done_releases_the_child_in_the_same_commit(
    store: Store, db: psycopg.Connection[Any]
) -> None:
    a = store.enqueue(Job("a")).id
    b = store.enqueue(Job("b")).id
    child = store.enqueue(Job("c", after=[a, b])).id
    future = store.enqueue(Job("c", after=[a], available_at=datetime.now(UTC) + timedelta(hours=1))).id
    assert store.worker.claim(["c"], 10, "w", LEASE) == []  # blocked jobs are never claimed
    finish(store, "a")
    assert state(store, child) is State.BLOCKED and waiting(db, child) == 1
    assert state(store, future) is State.SCHEDULED
    assert store.worker.claim(["c"], 10, "w", LEASE) == []
    # the closing transaction's done (settle_tx) releases too
    (rb,) = store.worker.claim(["b"], 1, "w", LEASE)
    with store.begin() as tx:
        assert store.worker.settle_tx(tx, Outcome(rb.id, rb.claim_token, State.DONE))
        row = store.get_tx(tx, child)
        assert row is not None and row.state is State.PENDING  # released before the commit
        assert state(store, child) is State.BLOCKED  # and not visible before it
    assert state(store, child) is State.PENDING and waiting(db, child) == 0
    assert [c.id for c in store.worker.claim(["c"], 10, "w", LEASE)] == [child]


def test_d2_a_child_enqueued_in_the_releasing_transaction_is_pending(store: Store) -> None:
    """The closing transaction enqueues first and writes the done last: a child naming the job
    that ends there is due at its release, not scheduled for later (its available_at, the enqueue
    statement's time, is after the transaction's start but before the release)."""
    p = store.enqueue(Job("p")).id
    (r,) = store.worker.claim(["p"], 1, "w", LEASE)
    with store.begin() as tx:
        child = store.enqueue_tx(tx, Job("c", after=[p])).id
        assert store.worker.settle_tx(tx, Outcome(r.id, r.claim_token, State.DONE))
    assert state(store, child) is State.PENDING
    assert [c.id for c in store.worker.claim(["c"], 10, "w", LEASE)] == [child]


def test_d2_a_release_wakes_the_engines_of_the_childs_topic(store: Store) -> None:
    p = store.enqueue(Job("p")).id
    store.enqueue(Job("woken", after=[p]))
    listener = store.worker.listen(["woken"])
    try:
        while listener.wait(0.05):  # drain anything already queued
            pass
        finish(store, "p")
        assert listener.wait(10.0)
    finally:
        listener.close()


def test_d2_a_failed_or_retried_parent_keeps_its_child_blocked_until_done(store: Store) -> None:
    p = store.enqueue(Job("p")).id
    child = store.enqueue(Job("c", after=[p])).id
    (r,) = store.worker.claim(["p"], 1, "w", LEASE)
    store.worker.settle_many([Outcome(r.id, r.claim_token, State.FAILED, delay=timedelta(0))])
    assert state(store, child) is State.BLOCKED
    store.worker.stage(["p"], 10)
    finish(store, "p")
    assert state(store, child) is State.PENDING


def test_d2_a_parent_done_batched_with_hundreds_of_others_releases_its_children(
    store: Store, db: psycopg.Connection[Any]
) -> None:
    store.enqueue_many([Job("p", i) for i in range(300)])
    parents = [r.id for r in store.enqueue_many([Job("p", "parent") for _ in range(3)])]
    store.enqueue_many([Job("p", i) for i in range(300)])
    children = [r.id for r in store.enqueue_many([Job("c", after=[p]) for p in parents])]
    fan_in = store.enqueue(Job("c", after=parents)).id
    done = finish(store, "p")
    assert len(done) == 603
    assert all(state(store, c) is State.PENDING for c in children)
    assert state(store, fan_in) is State.PENDING and waiting(db, fan_in) == 0


def job_rows_read(conn: psycopg.Connection[Any]) -> int:
    """Index entries and heap rows of the job table this transaction has read so far (its own counters)."""
    row = conn.execute(
        """SELECT sum(pg_stat_get_xact_tuples_returned(c.oid) + pg_stat_get_xact_tuples_fetched(c.oid))
           FROM pg_class c
           WHERE c.oid = 'job'::regclass
              OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = 'job'::regclass)"""
    ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("end", ["done", "dead"])
def test_d2_d3_a_parents_end_reads_its_own_children_not_every_blocked_job(
    store: Store, dsn: str, schema: str, end: str
) -> None:
    """Releasing (D2) or canceling (D3) reads the parent's children by primary key, never the other
    blocked jobs: each parent's end costs O(its children) however many jobs wait elsewhere (on a
    fresh table too, whose statistics say it is small)."""
    other = store.enqueue(Job("other")).id
    store.enqueue_many([Job("elsewhere", after=[other]) for _ in range(3000)])
    parents = [r.id for r in store.enqueue_many([Job("p") for _ in range(20)])]
    children = store.enqueue_many([Job("c", after=[p]) for p in parents])
    store.enqueue_many([Job("g", after=[c.id]) for c in children])
    with psycopg.connect(dsn) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        conn.execute(
            "UPDATE job SET state = 'processing', locked_by = 'w', locked_until = now() WHERE id = ANY (%s::uuid[])",
            (parents,),
        )
        before = job_rows_read(conn)
        for p in parents:  # by primary key: the test's own statements read one row each
            conn.execute("UPDATE job SET state = %s, updated_at = now() WHERE id = %s", (end, p))
        read = job_rows_read(conn) - before
        conn.commit()
    expected = State.PENDING if end == "done" else State.CANCELED
    assert {state(store, c.id) for c in children} == {expected}
    # 20 parents, 20 children, 20 grandchildren: a few reads each, not 3,000 per parent
    assert read < 1000, read


def test_d2_o4_a_settle_during_a_childs_enqueue_neither_waits_nor_loses_the_child(
    store: Store, pool: ConnectionPool[Any], db: psycopg.Connection[Any]
) -> None:
    """The enqueue writes no parent row, so the parent's done does not wait for its commit; the
    done could not see the child, so the stager's sweep releases it (D1', O4)."""
    p = store.enqueue(Job("p")).id
    (r,) = store.worker.claim(["p"], 1, "w", LEASE)
    written: list[set[str]] = []
    with store.begin() as tx:
        child = store.enqueue_tx(tx, Job("c", after=[p])).id
        settler = threading.Thread(
            target=lambda: written.append(
                store.worker.settle_many([Outcome(r.id, r.claim_token, State.DONE)])
            )
        )
        settler.start()
        settler.join(30)
        assert written == [{p}], "the settle waited for the enqueue"
    assert state(store, child) is State.BLOCKED
    store.worker.stage(["c"], 100)
    assert state(store, child) is State.PENDING


def test_d2_an_enqueue_during_the_parents_settle_neither_waits_nor_is_lost(
    store: Store, db: psycopg.Connection[Any]
) -> None:
    """The settle holds the parent's row; the enqueue does not wait for it and, not seeing the
    done yet, leaves the child blocked for the stager's sweep (D1', O4)."""
    p = store.enqueue(Job("p")).id
    (r,) = store.worker.claim(["p"], 1, "w", LEASE)
    made: list[str] = []
    with store.begin() as tx:
        assert store.worker.settle_tx(tx, Outcome(r.id, r.claim_token, State.DONE))
        enqueuer = threading.Thread(target=lambda: made.append(store.enqueue(Job("c", after=[p])).id))
        enqueuer.start()
        enqueuer.join(30)
        assert made, "the enqueue waited for the settle"
    assert state(store, made[0]) is State.BLOCKED
    store.worker.stage(["c"], 100)
    assert state(store, made[0]) is State.PENDING


# -- D3: failure propagation ----------------------------------------------------------------


@pytest.mark.parametrize("how", ["dead", "cancel", "psql"])
def test_d3_a_grandchild_is_canceled_when_the_root_ends_dead_or_canceled(
    store: Store, db: psycopg.Connection[Any], how: str
) -> None:
    root = store.enqueue(Job("root")).id
    other = store.enqueue(Job("other")).id
    child = store.enqueue(Job("c", after=[root])).id
    grandchild = store.enqueue(Job("g", after=[child, other])).id
    unrelated = store.enqueue(Job("u", after=[other])).id
    if how == "dead":
        finish(store, "root", State.DEAD)
    elif how == "cancel":
        assert store.cancel(root)
    else:
        db.execute("UPDATE job SET state = 'canceled' WHERE id = %s", (root,))
    ended = "dead" if how == "dead" else "canceled"
    for job_id in (child, grandchild):
        row = store.get(job_id)
        assert row is not None and row.state is State.CANCELED
        assert row.last_error == f"canceled: parent {root} ended {ended}"
    assert state(store, unrelated) is State.BLOCKED
    finish(store, "other")
    assert state(store, unrelated) is State.PENDING
    assert state(store, grandchild) is State.CANCELED  # a canceled child is never released
    # A canceled child is not retried alone while a parent is not done.
    assert not store.retry(child)
    assert store.retry_refusal(child) == (
        f"its parent {root} is {ended}: a job runs only after its parents are done (retry the parent first)"
    )
    # Retrying the root does not resurrect what it canceled.
    assert store.retry(root)
    finish(store, "root")
    assert state(store, child) is State.CANCELED and state(store, grandchild) is State.CANCELED


def test_d3_a_blocked_job_can_be_canceled_and_its_descendants_with_it(store: Store) -> None:
    p = store.enqueue(Job("p")).id
    child = store.enqueue(Job("c", after=[p])).id
    grandchild = store.enqueue(Job("g", after=[child])).id
    assert store.cancel(child)
    assert state(store, child) is State.CANCELED and state(store, grandchild) is State.CANCELED
    finish(store, "p")
    assert state(store, child) is State.CANCELED


def test_d2_d4_a_job_whose_parent_retention_deleted_is_not_retried(
    store: Store, db: psycopg.Connection[Any]
) -> None:
    """A parent gone (retention may delete it once its children have ended) cannot be shown done:
    the child is not retried, whether that parent died (the child would run after a dead parent)
    or was done (parent_results would miss it); the refusal names it."""
    dead = store.enqueue(Job("p")).id
    finish(store, "p", State.DEAD)
    born_canceled = store.enqueue(Job("c", after=[dead])).id
    done = store.enqueue(Job("q")).id
    finish(store, "q")
    ran = store.enqueue(Job("r", after=[done])).id
    finish(store, "r", State.DEAD)
    db.execute(
        "UPDATE job SET updated_at = now() - interval '2 days' WHERE id = ANY (%s::uuid[])", ([dead, done],)
    )
    assert sorted(d[0] for d in store.worker.delete_terminal(timedelta(days=1), 100)) == sorted([dead, done])
    for child, parent in ((born_canceled, dead), (ran, done)):
        assert not store.retry(child)
        assert store.retry_refusal(child) == (
            f"its parent {parent} no longer exists: a job runs only after its parents are done"
        )
    assert state(store, born_canceled) is State.CANCELED and state(store, ran) is State.DEAD


def test_d3_a_diamond_cancels_its_join_once(store: Store) -> None:
    a = store.enqueue(Job("a")).id
    b = store.enqueue(Job("b", after=[a])).id
    c = store.enqueue(Job("c", after=[a])).id
    d = store.enqueue(Job("d", after=[b, c])).id
    finish(store, "a", State.DEAD)
    assert [state(store, j) for j in (b, c, d)] == [State.CANCELED] * 3


# -- D4: retention --------------------------------------------------------------------------


def test_d4_retention_keeps_a_done_parent_until_its_children_end(
    store: Store, db: psycopg.Connection[Any]
) -> None:
    p = store.enqueue(Job("p")).id
    plain = store.enqueue(Job("p")).id
    finish(store, "p")
    child = store.enqueue(Job("c", after=[p])).id
    db.execute("UPDATE job SET updated_at = now() - interval '2 days' WHERE topic = 'p'")
    deleted = store.worker.delete_terminal(timedelta(days=1), 100)
    assert [d[0] for d in deleted] == [plain]
    assert store.get(p) is not None
    finish(store, "c")
    db.execute("UPDATE job SET updated_at = now() - interval '2 days'")
    assert sorted(d[0] for d in store.worker.delete_terminal(timedelta(days=1), 100)) == sorted([p, child])
    assert edges(db) == set()


def test_d4_a_child_committed_while_retention_runs_keeps_its_parent(
    store: Store, dsn: str, db: psycopg.Connection[Any]
) -> None:
    """Retention's snapshot is taken before the child's commit, its lock on the parent after it: the
    parent must not be deleted under the child (or the child must be refused). A test-only trigger
    holds retention inside its batch, on the row before the parent, until the child is committed
    or waits."""
    old = store.enqueue(Job("old")).id
    p = store.enqueue(Job("p")).id
    finish(store, "old")
    finish(store, "p")
    db.execute("UPDATE job SET updated_at = now() - interval '3 days' WHERE id = %s", (old,))
    db.execute("UPDATE job SET updated_at = now() - interval '2 days' WHERE id = %s", (p,))
    key = uuid.uuid4().int % 2**31
    db.execute(
        sql.SQL(
            "CREATE FUNCTION hold() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "IF OLD.topic = 'old' THEN PERFORM pg_advisory_xact_lock({}); END IF; RETURN OLD; END $$"
        ).format(sql.Literal(key))
    )
    db.execute("CREATE TRIGGER hold BEFORE DELETE ON job FOR EACH ROW EXECUTE FUNCTION hold()")
    deleted: list[list[tuple[str, str]]] = []
    made: list[str | Exception] = []

    def enqueue() -> None:
        try:
            made.append(store.enqueue(Job("c", after=[p])).id)
        except InvalidJob as exc:
            made.append(exc)

    def held() -> int | None:  # the retention's backend, once it waits for the test's lock
        row = db.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objid = %s AND NOT granted", (key,)
        ).fetchone()
        return None if row is None else int(row[0])

    def blocked_by(pid: int) -> bool:
        row = db.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY (pg_blocking_pids(pid))", (pid,)
        )
        return row.fetchone() == (1,)

    from tests.polling import wait_for

    with psycopg.connect(dsn) as gate:
        gate.execute("SELECT pg_advisory_xact_lock(%s)", (key,))
        retention = threading.Thread(
            target=lambda: deleted.append(store.worker.delete_terminal(timedelta(days=1), 10))
        )
        retention.start()
        pid = wait_for(held, "retention held on the oldest row")
        enqueuer = threading.Thread(target=enqueue)
        enqueuer.start()
        wait_for(lambda: made or blocked_by(pid), "the child committed, or waiting for retention")
        gate.rollback()
        retention.join(30)
        enqueuer.join(30)
    (outcome,) = made
    if isinstance(outcome, Exception):  # the parent was deleted first: the child was refused
        assert store.get(p) is None and "does not exist" in str(outcome)
    else:  # the child was committed first: its parent stays while it is active
        assert store.get(p) is not None, "retention deleted the parent of an active child"
        assert store.parent_results(outcome) == {p: None}
    assert old in [d[0] for d in deleted[0]]


# -- D6 and the group ---------------------------------------------------------------------


def test_d6_enqueue_group_fans_in_and_parent_results_reads_each_result(
    store: Store, db: psycopg.Connection[Any]
) -> None:
    group = store.enqueue_group([Job("shard", i) for i in range(3)], then=Job("merge"))
    assert group.then_id is not None and len(group.ids) == 3
    assert state(store, group.then_id) is State.BLOCKED and waiting(db, group.then_id) == 3
    rows = store.worker.claim(["shard"], 10, "w", LEASE)
    store.worker.settle_many(
        [Outcome(r.id, r.claim_token, State.DONE, result=f'{{"n": {r.payload}}}') for r in rows]
    )
    assert store.parent_results(group.then_id) == {gid: {"n": i} for i, gid in enumerate(group.ids)}
    assert store.parent_results(group.ids[0]) == {}
    # an empty group's `then` has no parent: pending at once
    empty = store.enqueue_group([], then=Job("merge"))
    assert empty.ids == [] and empty.then_id is not None and state(store, empty.then_id) is State.PENDING
    assert store.enqueue_group([Job("x")]).then_id is None


def test_d5_a_then_after_ten_thousand_parents_is_released_by_the_last_done(
    store: Store, db: psycopg.Connection[Any]
) -> None:
    group = store.enqueue_group([Job("many", i) for i in range(10_000)], then=Job("join"))
    assert group.then_id is not None and waiting(db, group.then_id) == 10_000
    for _ in range(9):
        finish(store, "many", n=1111)
    assert state(store, group.then_id) is State.BLOCKED and waiting(db, group.then_id) == 1
    finish(store, "many")
    assert state(store, group.then_id) is State.PENDING
    assert len(store.parent_results(group.then_id)) == 10_000


def test_d1_f2_a_full_topic_refuses_a_blocked_job_and_counts_blocked_ones(
    store: Store, db: psycopg.Connection[Any]
) -> None:
    p = store.enqueue(Job("p")).id
    store.set_max_depth("c", 2)
    first = store.enqueue_many([Job("c", after=[p]), Job("c", after=[p])])
    with pytest.raises(QueueFull), store.begin() as tx:
        try:
            store.enqueue_tx(tx, Job("c", after=[p]))
        finally:
            assert store.enqueue_tx(tx, Job("other")).created  # the transaction is still usable
    assert {state(store, r.id) for r in first} == {State.BLOCKED}
    assert edges(db) == {(p, r.id) for r in first}
    # a duplicate writes nothing, so a full topic answers it with its holder
    store.set_max_depth("c", None)
    keyed = store.enqueue(Job("c", idempotency_key="k", after=[p]))
    store.set_max_depth("c", 3)
    assert store.enqueue_many([Job("c", idempotency_key="k", after=[p])]) == [(keyed.id, False)]


def test_d6_f2_a_group_whose_then_finds_its_topic_full_writes_nothing(
    store: Store, db: psycopg.Connection[Any]
) -> None:
    """QueueFull for the `then` comes before the group is written: the caller's transaction, still
    usable, holds nothing of the call."""
    store.set_max_depth("t", 1)
    store.enqueue(Job("t"))
    with store.begin() as tx:
        with pytest.raises(QueueFull):
            store.enqueue_group([Job("g"), Job("g")], then=Job("t"), tx=tx)
        kept = store.enqueue_tx(tx, Job("x")).id
    assert {r[0] for r in db.execute("SELECT topic FROM job").fetchall()} == {"t", "x"}
    assert edges(db) == set() and store.get(kept) is not None
    # the group's jobs of the `then`'s topic count too
    store.set_max_depth("t", 3)
    with pytest.raises(QueueFull):
        store.enqueue_group([Job("t"), Job("t")], then=Job("t"))
    group = store.enqueue_group([Job("t")], then=Job("t"))
    assert group.then_id is not None and state(store, group.then_id) is State.BLOCKED
    assert store.queue_full_refusals() == {"t": 2}


def test_d1_after_with_a_unique_key_is_refused(store: Store, db: psycopg.Connection[Any]) -> None:
    p = store.enqueue(Job("p")).id
    with pytest.raises(InvalidJob, match="unique_key"):
        store.enqueue(Job("c", unique_key="u", after=[p]))
    # in one batch with a job naming parents too: the unique-key statement would drop the parents
    # (the job pending at once, never waiting for p), so the batch is refused before any statement
    with pytest.raises(InvalidJob, match="unique_key"):
        store.enqueue_many([Job("u", unique_key="u"), Job("c", after=[p])])
    with store.begin() as tx, pytest.raises(InvalidJob, match="unique_key"):
        store.enqueue_group([Job("u", unique_key="u"), Job("c", after=[p])], tx=tx)
    # a `then` with a unique key waits for the group: refused before the group is written in the
    # caller's transaction (which stays usable and may commit)
    with store.begin() as tx, pytest.raises(InvalidJob, match="unique_key"):
        store.enqueue_group([Job("g")], then=Job("t", unique_key="u"), tx=tx)
    assert db.execute("SELECT id::text FROM job").fetchall() == [(p,)]
    alone = store.enqueue_group([], then=Job("t", unique_key="u")).then_id  # no parents: it may
    assert alone is not None and state(store, alone) is State.PENDING


def test_d2_d3_a_child_canceled_while_its_parents_done_runs_stays_canceled(
    store: Store, db: psycopg.Connection[Any]
) -> None:
    """The cancel holds the child's row; the parent's done does not wait for it (O4), and the
    sweep after the cancel's commit leaves the child canceled."""
    p = store.enqueue(Job("p")).id
    child = store.enqueue(Job("c", after=[p])).id
    (r,) = store.worker.claim(["p"], 1, "w", LEASE)
    written: list[set[str]] = []
    with store.begin() as tx:
        tx.execute(
            sql.SQL("UPDATE {} SET state = 'canceled' WHERE id = %s").format(
                sql.Identifier(store.schema, "job")
            ),
            (child,),
        )
        settler = threading.Thread(
            target=lambda: written.append(
                store.worker.settle_many([Outcome(r.id, r.claim_token, State.DONE)])
            )
        )
        settler.start()
        settler.join(30)
        assert written == [{p}], "the parent's done waited for the cancel"
    store.worker.stage(["c"], 100)
    assert state(store, p) is State.DONE and state(store, child) is State.CANCELED
    assert db.execute("SELECT count(*) FROM job_wait").fetchone() == (0,)
    # and the other way round: a done that released the child first, then the cancel
    q = store.enqueue(Job("q")).id
    other = store.enqueue(Job("c", after=[q])).id
    finish(store, "q")
    assert state(store, other) is State.PENDING and store.cancel(other)

"""Tenants, sequences and parking where they meet the outside world: rows locked by an operator,
unique keys on a parking topic, jobs without a tenant behind a backlog (SPEC T1, Q5, F3, U1)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from psycopg import sql
from psycopg_pool import ConnectionPool

from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.queue import Claim, Context, Job, KindOptions, State
from brooq_py.queue.port import Outcome
from tests.integration.conftest import q
from tests.polling import wait_for

LEASE = timedelta(seconds=30)
ACTIVE_HOLDERS = (
    "SELECT unique_key, count(*) FROM {job} WHERE topic = %s AND unique_key IS NOT NULL"
    " AND state IN ('scheduled', 'pending', 'processing', 'failed', 'blocked') GROUP BY 1"
)


def claim(store: Store, topic: str, n: int) -> list[Any]:
    store.worker.topic_settings()
    return list(store.worker.claim_limited(topic, n, "w", LEASE))


def holds(pool: ConnectionPool[Any], schema: str) -> int:
    """The canceled sequence members whose handlers may still run (migration 0021)."""
    with pool.connection() as conn:
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {}.job_sequence_hold").format(sql.Identifier(schema))
        ).fetchone()
    assert row is not None
    return int(row[0])


def state(store: Store, job_id: str) -> State:
    row = store.get(job_id)
    assert row is not None
    return row.state


# --- F3 x U1: a unique key on a parking topic ---------------------------------------------------


def test_f3_u1_two_parked_jobs_of_one_unique_key_are_released_one_after_the_other(
    store: Store, pool: ConnectionPool[Any], schema: str
) -> None:
    """A parked job takes no unique key slot (docs/rate-limits.md), so two jobs of one key can be
    parked; releasing both at once would break the unique index and fail the stager's whole tick
    (every parking topic's release, and the staging of due jobs after it). The oldest of a key is
    released, the other waits parked until the holder ended; the jobs behind them go on."""
    store.set_max_depth("pk.u", 3, park=True)
    fill = [store.enqueue(Job("pk.u", n)).id for n in range(3)]
    x = store.enqueue(Job("pk.u", "x", unique_key="k")).id
    y = store.enqueue(Job("pk.u", "y", unique_key="k")).id
    z = store.enqueue(Job("pk.u", "z")).id
    assert [state(store, i) for i in (x, y, z)] == [State.PARKED] * 3
    for i in fill:
        store.cancel(i)
    store.worker.stage(["pk.u"], 100)  # raised UniqueViolation, every tick
    assert [state(store, i) for i in (x, y, z)] == [State.PENDING, State.PARKED, State.PENDING]
    assert dict(q(pool, schema, ACTIVE_HOLDERS, "pk.u")) == {"k": 1}
    store.cancel(x)
    store.worker.stage(["pk.u"], 100)
    assert state(store, y) is State.PENDING


def test_f3_u1_a_parked_job_whose_key_a_retried_job_holds_waits_and_the_rest_is_released(
    store: Store, pool: ConnectionPool[Any], schema: str
) -> None:
    """The unique key of a parked job taken meanwhile by another job of the topic (a dead one
    retried): the release leaves that parked job parked and releases the others."""
    store.set_max_depth("pk.r", 1, park=True)
    first = store.enqueue(Job("pk.r", "first", unique_key="k")).id
    got = store.worker.claim(["pk.r"], 1, "w", LEASE)
    assert [r.id for r in got] == [first]
    store.worker.settle_many([Outcome(first, got[0].claim_token, State.DEAD, last_error="x")])
    filler = store.enqueue(Job("pk.r", "filler")).id
    parked = store.enqueue(Job("pk.r", "again", unique_key="k")).id
    behind = store.enqueue(Job("pk.r", "behind")).id
    assert state(store, parked) is State.PARKED
    store.retry(first)  # the key is held again (a retry is never parked)
    store.cancel(filler)
    store.set_max_depth("pk.r", 5, park=True)
    store.worker.stage(["pk.r"], 100)
    assert [state(store, i) for i in (first, parked, behind)] == [State.PENDING, State.PARKED, State.PENDING]
    assert dict(q(pool, schema, ACTIVE_HOLDERS, "pk.r")) == {"k": 1}
    store.cancel(first)
    store.worker.stage(["pk.r"], 100)
    assert state(store, parked) is State.PENDING


# --- T1: jobs without a tenant behind a named tenant's backlog --------------------------------------


def test_t1_jobs_without_a_tenant_get_their_turn_behind_a_large_named_backlog(store: Store) -> None:
    """Jobs without a tenant are one more tenant of a tenant topic (job_claim_fair.sql): enqueued
    after tenant A's backlog of 200, they get every other claim, as tenant B's jobs would."""
    store.enqueue_many([Job("tn.big", {"a": i}, tenant="A") for i in range(200)])
    store.enqueue_many([Job("tn.big", {"n": i}) for i in range(5)])
    got = claim(store, "tn.big", 6)
    assert Counter("a" in r.payload for r in got) == {True: 3, False: 3}


# --- T1: a row of the fair order locked by an operator ----------------------------------------------


def test_t1_a_tenant_job_locked_by_an_operator_is_passed_over_not_waited_for(
    store: Store, pool: ConnectionPool[Any], schema: str
) -> None:
    """psql holds `SELECT ... FOR UPDATE` on the first job of a tenant topic's order: a claim of one
    job takes the next one (as job_claim_limited does), rather than nothing for as long as the
    lock is held."""
    ids = [r.id for r in store.enqueue_many([Job("tn.lock", n, tenant=f"t{n % 2}") for n in range(4)])]
    with pool.connection() as conn, conn.transaction():
        conn.execute(
            sql.SQL("SELECT 1 FROM {}.job WHERE id = %s FOR UPDATE").format(sql.Identifier(schema)), (ids[0],)
        )
        got = claim(store, "tn.lock", 1)
        assert [r.payload for r in got] == [1]
        got = claim(store, "tn.lock", 1)
        assert [r.payload for r in got] == [2]


def test_t1_an_engine_runs_a_tenant_topic_while_psql_holds_its_first_job(
    store: Store, pool: ConnectionPool[Any], schema: str, engines: Callable[..., Engine]
) -> None:
    ran: list[int] = []
    ids = [r.id for r in store.enqueue_many([Job("tn.lock2", n, tenant="a") for n in range(4)])]
    e = engines(workers=1, poll_interval=0.05)
    e.register_kind("tn.lock2", lambda ctx, c: ran.append(c.payload))
    with pool.connection() as conn, conn.transaction():
        conn.execute(
            sql.SQL("SELECT 1 FROM {}.job WHERE id = %s FOR UPDATE").format(sql.Identifier(schema)), (ids[0],)
        )
        e.start()
        wait_for(lambda: len(ran) == 3, "the three jobs not locked to run beside the lock", timeout=20)
    wait_for(lambda: len(ran) == 4, "the locked job once the lock is gone", timeout=20)
    assert sorted(ran) == [0, 1, 2, 3]


# --- Q5: a sequence member locked by an operator ----------------------------------------------------


def test_q5_a_running_member_locked_by_an_operator_ends_after_the_lock_and_the_next_runs_once(
    store: Store, pool: ConnectionPool[Any], schema: str, engines: Callable[..., Engine]
) -> None:
    """psql locks the running member's row: its outcome waits for the lock (its own row), then the
    next member runs, once, after it."""
    import threading

    go = threading.Event()
    ran: list[tuple[str, int]] = []

    def handler(ctx: Context, claim: Claim) -> None:
        ran.append(("start", claim.payload))
        if claim.payload == 0:
            assert go.wait(30)
        ran.append(("end", claim.payload))

    e = engines(workers=2, poll_interval=0.05)
    e.register_kind("seq.oplock", handler, KindOptions())
    e.start()
    first = store.enqueue(Job("seq.oplock", 0, sequence="s")).id
    nxt = store.enqueue(Job("seq.oplock", 1, sequence="s")).id
    wait_for(lambda: state(store, first) is State.PROCESSING, "the first member running")
    with pool.connection() as conn, conn.transaction():
        conn.execute(
            sql.SQL("SELECT 1 FROM {}.job WHERE id = %s FOR UPDATE").format(sql.Identifier(schema)), (first,)
        )
        go.set()
        wait_for(lambda: ("end", 0) in ran, "the handler to return")
        assert state(store, nxt) is State.BLOCKED
    wait_for(lambda: state(store, nxt) is State.DONE, "the next member after the lock")
    assert ran == [("start", 0), ("end", 0), ("start", 1), ("end", 1)]


def test_q5_a_running_member_canceled_lets_the_next_run_only_after_its_handler_returned(
    store: Store, engines: Callable[..., Engine]
) -> None:
    """Canceling the running member: the next one does not start while the canceled handler still
    runs (a handler that checks its context late)."""
    import threading
    import time

    lock = threading.Lock()
    running: set[int] = set()
    beside: list[tuple[int, ...]] = []
    go = threading.Event()

    def handler(ctx: Context, claim: Claim) -> None:
        with lock:
            running.add(claim.payload)
            if len(running) > 1:
                beside.append(tuple(sorted(running)))
        try:
            if claim.payload == 0:
                go.set()
                time.sleep(1.5)  # notices the cancel only when it looks
                ctx.raise_if_done()
        finally:
            with lock:
                running.discard(claim.payload)

    e = engines(workers=2, poll_interval=0.05)
    e.register_kind("seq.cancel", handler)
    e.start()
    first = store.enqueue(Job("seq.cancel", 0, sequence="c")).id
    nxt = store.enqueue(Job("seq.cancel", 1, sequence="c")).id
    assert go.wait(20)
    store.cancel(first)
    wait_for(lambda: state(store, nxt) is State.DONE, "the next member", timeout=20)
    assert state(store, first) is State.CANCELED
    assert beside == []


def test_q5_a_canceled_member_whose_handler_ignores_the_cancel_holds_the_next_until_declared_hung(
    store: Store, pool: ConnectionPool[Any], schema: str, engines: Callable[..., Engine]
) -> None:
    """The canceled member's handler ignores its cancel past max_execution_timeout: the next member
    waits while the engine still waits for that handler, and runs once the engine gave it up (its
    hung verdict, watchdog_grace after the cancel), the ignored handler still stuck."""
    import threading

    saw_cancel = threading.Event()
    free = threading.Event()
    ran: list[int] = []

    def handler(ctx: Context, claim: Claim) -> None:
        ran.append(claim.payload)
        if claim.payload == 0:
            while not free.wait(0.02):  # never looks at its cancel but to report it
                if ctx.done():
                    saw_cancel.set()

    e = engines(workers=2, poll_interval=0.05, watchdog_grace=4)
    e.register_kind("seq.hung", handler, KindOptions(max_execution_timeout=1, attempt_timeout=0.5))
    e.start()
    try:
        first = store.enqueue(Job("seq.hung", 0, sequence="h")).id
        nxt = store.enqueue(Job("seq.hung", 1, sequence="h")).id
        wait_for(lambda: ran == [0], "the first member running")
        store.cancel(first)
        assert saw_cancel.wait(20), "the cancel never reached the handler"
        assert state(store, nxt) is State.BLOCKED
        assert holds(pool, schema) == 1
        wait_for(
            lambda: state(store, nxt) is State.DONE, "the next member after the hung verdict", timeout=30
        )
        assert not free.is_set() and ran == [0, 1]
        assert state(store, first) is State.CANCELED
        wait_for(lambda: holds(pool, schema) == 0, "no hold left")
    finally:
        free.set()

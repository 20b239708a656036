"""Sequences (SPEC Q5) where they meet parking (F3), operators' row locks, unique keys, cancels of
running batch members, retries and resumes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from psycopg_pool import ConnectionPool

from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.queue import Claim, Context, Job, KindOptions, State
from tests.integration.conftest import q
from tests.polling import wait_for


def state(store: Store, job_id: str) -> State:
    row = store.get(job_id)
    assert row is not None
    return row.state


class Order:
    """Each handler run's (payload, start, end) on the monotonic clock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runs: list[list[Any]] = []

    def start(self, payload: Any) -> list[Any]:
        run = [payload, time.monotonic(), None]
        with self.lock:
            self.runs.append(run)
        return run

    def started(self) -> list[Any]:
        with self.lock:
            return [r[0] for r in self.runs]


# --- Q5 x F3: a parked member is passed by a later one -----------------------------------------


@pytest.mark.xfail(strict=True, reason="known: docs/sequences.md, a parked member does not keep its turn")
def test_q5_f3_removing_the_cap_lets_a_later_member_run_before_a_parked_earlier_one(
    store: Store, pool: ConnectionPool[Any], schema: str, engines: Callable[..., Engine]
) -> None:
    """A member parked past a parking cap keeps its turn in its sequence (rate-limits/sequences docs:
    'a member of a sequence goes to blocked and owes its release, keeping its turn'). The operator
    removes the cap (a documented action: 'a topic that parks no more releases its parked jobs')
    and a producer enqueues the next member of the same sequence. The earlier member must run first."""
    topic = "at.park"
    store.set_max_depth(topic, 1, park=True)
    # a job due in an hour fills the cap (scheduled jobs count in the depth)
    store.enqueue(Job(topic, "filler", available_at=datetime.now(UTC) + timedelta(hours=1)))
    first = store.enqueue(Job(topic, "first", sequence="s"))
    assert state(store, first.id) is State.PARKED
    store.set_max_depth(topic, None)  # the operator lifts the cap
    second = store.enqueue(Job(topic, "second", sequence="s"))
    assert state(store, second.id) is State.BLOCKED
    assert first.id < second.id  # enqueue order
    store.stage([topic], 100)  # one stager tick, as any engine's
    after_tick = (state(store, first.id), state(store, second.id))
    order = Order()
    e = engines(workers=2, poll_interval=0.05)
    e.register_kind(topic, lambda ctx, claim: order.start(claim.payload) and None)
    e.start()
    wait_for(lambda: state(store, first.id) is State.DONE and state(store, second.id) is State.DONE, "both")
    # the earlier member must be the one released, the later one still waiting for it; and run first
    assert after_tick[1] is State.BLOCKED and after_tick[0] in (State.BLOCKED, State.PENDING), after_tick
    assert order.started() == ["first", "second"]


@pytest.mark.xfail(strict=True, reason="known: docs/sequences.md, a parked member does not keep its turn")
def test_q5_f3_an_operator_lock_on_a_parked_member_lets_the_next_member_jump_it(
    store: Store, pool: ConnectionPool[Any], schema: str, engines: Callable[..., Engine]
) -> None:
    """Parking kept on. A row lock held elsewhere (psql) on a parked member must only delay that
    member (P1', O4), never let the member after it in its sequence run first."""
    topic = "at.parklock"
    order = Order()

    def handler(ctx: Context, claim: Claim) -> None:
        order.start(claim.payload)

    store.set_max_depth(topic, 1, park=True)
    head = store.enqueue(Job(topic, "m1", sequence="s")).id  # fills the cap (blocked counts)
    m2 = store.enqueue(Job(topic, "m2", sequence="s")).id
    m3 = store.enqueue(Job(topic, "m3", sequence="s")).id
    assert [state(store, i) for i in (head, m2, m3)] == [State.BLOCKED, State.PARKED, State.PARKED]
    with pool.connection() as conn, conn.transaction():
        conn.execute(f'SELECT 1 FROM "{schema}".job WHERE id = %s FOR UPDATE', (m2,))
        e = engines(workers=2, poll_interval=0.05)
        e.register_kind(topic, handler)
        e.start()
        wait_for(lambda: state(store, head) is State.DONE, "the first member done")
        # give the stagers every chance to release the parked members while m2 is locked
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline and state(store, m3) is State.PARKED:
            time.sleep(0.05)
        during_lock = order.started()
        states_in_lock = [state(store, i) for i in (m2, m3)]
    wait_for(lambda: all(state(store, i) is State.DONE for i in (m2, m3)), "every member done", timeout=60)
    assert during_lock == ["m1"], f"ran while m2 was locked: {during_lock}"
    assert order.started() == ["m1", "m2", "m3"], f"states while m2 was locked: {states_in_lock}"


@pytest.mark.xfail(strict=True, reason="known: docs/sequences.md, a parked member does not keep its turn")
def test_q5_f3_a_parked_member_whose_unique_key_is_held_is_jumped_by_the_next_member(
    store: Store, pool: ConnectionPool[Any], schema: str, engines: Callable[..., Engine]
) -> None:
    """The parked release passes over a parked job whose unique key an active job holds
    (topic_parked_release.sql); for a member of a sequence that means the member after it is
    released first and runs first."""
    topic = "at.parkuq"
    order = Order()
    release = threading.Event()

    def handler(ctx: Context, claim: Claim) -> None:
        order.start(claim.payload)
        if claim.payload == "holder":
            assert release.wait(60)

    store.set_max_depth(topic, 1, park=True)
    store.enqueue(Job(topic, "filler", available_at=datetime.now(UTC) + timedelta(hours=1)))
    m1 = store.enqueue(Job(topic, "m1", sequence="s", unique_key="k")).id  # parked
    m2 = store.enqueue(Job(topic, "m2", sequence="s")).id  # parked
    assert [state(store, i) for i in (m1, m2)] == [State.PARKED, State.PARKED]
    store.set_max_depth(topic, None)  # room for everyone now
    holder = store.enqueue(Job(topic, "holder", unique_key="k")).id  # an active job holds key k
    e = engines(workers=2, poll_interval=0.05)
    e.register_kind(topic, handler)
    e.start()
    wait_for(lambda: state(store, holder) is State.PROCESSING, "the key's holder running")
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline and state(store, m2) is not State.DONE:
        time.sleep(0.05)
    release.set()
    wait_for(lambda: all(state(store, i) is State.DONE for i in (m1, m2)), "both members", timeout=60)
    members = [p for p in order.started() if p in ("m1", "m2")]
    assert members == ["m1", "m2"], members


# --- Q5 x BD1: a canceled member of a running batch ----------------------------------------------


def test_q5_bd1_a_canceled_member_in_a_running_batch_call_holds_the_next_until_the_call_ended(
    store: Store, pool: ConnectionPool[Any], schema: str, engines: Callable[..., Engine]
) -> None:
    """docs/sequences.md: the member after a canceled running one runs once its handler no longer
    runs. A batch call is not told of one of its jobs' cancel (docs/batches.md), so the canceled
    member's claim is held until the call returns: it was declared hung after watchdog_grace and
    the next member ran beside the call still running it."""
    topic = "at.bseq"
    lock = threading.Lock()
    calls: list[list[Any]] = []  # [payloads, start, end]
    release = threading.Event()

    def handler(ctx: Context, claims: list[Claim]) -> list[Any]:
        call = [[c.payload for c in claims], time.monotonic(), None]
        with lock:
            calls.append(call)
        if "slow" in call[0]:
            release.wait(10)  # a long call (a bulk request, say), past the grace (3 s)
        call[2] = time.monotonic()
        return [None] * len(claims)

    first = store.enqueue(Job(topic, "slow", sequence="s")).id
    store.enqueue(Job(topic, "beside"))  # in the same call, in no sequence
    nxt = store.enqueue(Job(topic, "next", sequence="s")).id
    e = engines(workers=4, poll_interval=0.05)  # watchdog_grace unset: the lease (3 s here)
    store.stage([topic], 100)  # one stager tick: the first member is ready beside "beside"
    assert state(store, first) is State.PENDING
    e.register_batch(topic, handler, KindOptions(batch_size=2))
    e.start()
    wait_for(lambda: len(calls) == 1, "the call running the first member")
    assert sorted(calls[0][0]) == ["beside", "slow"]
    q(pool, schema, "UPDATE {job} SET state = 'canceled' WHERE id = %s", first)  # the documented psql cancel
    # wait (generously) either for the next member to start or for the slow call to end by itself
    wait_for(lambda: len(calls) >= 2 or calls[0][2] is not None, "the next call or the first's end", 30)
    with lock:
        snapshot = [list(c) for c in calls]
    release.set()
    wait_for(lambda: state(store, nxt) is State.DONE, "the next member", timeout=60)
    assert state(store, first) is State.CANCELED
    assert len(snapshot) == 1 or snapshot[0][2] is not None, (
        f"the next member's call started {snapshot[1][1] - snapshot[0][1]:.2f}s after the first call,"
        " while the call running the canceled member was still running"
    )


# --- Q5: retry / resume of a dead member with later members (held expected) ------------------


def test_q5_retry_and_resume_racing_leave_one_member_at_a_time(
    store: Store, pool: ConnectionPool[Any], schema: str, engines: Callable[..., Engine]
) -> None:
    topic = "at.race"
    lock = threading.Lock()
    running: set[str] = set()
    overlaps: list[tuple[str, str]] = []
    order: list[str] = []
    fail = threading.Event()
    fail.set()

    def handler(ctx: Context, claim: Claim) -> None:
        with lock:
            for other in running:
                overlaps.append((other, claim.payload))
            running.add(claim.payload)
            order.append(claim.payload)
        try:
            time.sleep(0.2)
            if claim.payload == "d" and fail.is_set():
                raise RuntimeError("boom")
        finally:
            with lock:
                running.discard(claim.payload)

    e1 = engines(workers=3, poll_interval=0.05)
    e1.register_kind(topic, handler, KindOptions(max_attempts=1))
    e2 = engines(workers=3, poll_interval=0.05)
    e2.register_kind(topic, handler, KindOptions(max_attempts=1))
    e1.start()
    e2.start()
    for round_ in range(3):
        seq = f"r{round_}"
        d = store.enqueue(Job(topic, "d", sequence=seq)).id
        later = [store.enqueue(Job(topic, f"{seq}-{n}", sequence=seq)).id for n in range(3)]
        wait_for(lambda d=d: state(store, d) is State.DEAD, "the member dead")
        fail.clear()
        results: dict[str, bool] = {}
        t1 = threading.Thread(
            target=lambda d=d, results=results: results.__setitem__("retry", store.retry(d))
        )
        t2 = threading.Thread(
            target=lambda seq=seq, results=results: results.__setitem__(
                "resume", store.resume_sequence(topic, seq)
            )
        )
        t1.start()
        t2.start()
        t1.join(30)
        t2.join(30)
        wait_for(
            lambda later=later, d=d: all(state(store, i) is State.DONE for i in [d, *later]),
            "every member done",
            timeout=60,
        )
        fail.set()
    assert overlaps == []


def test_q5_a_member_locked_by_an_operator_at_its_end_then_retried_dead_member(
    store: Store, pool: ConnectionPool[Any], schema: str, engines: Callable[..., Engine]
) -> None:
    """A dead member with members after it; the operator holds a row lock on the next member while
    retrying the dead one; then the lock goes. Order: dead member again first, then the rest."""
    topic = "at.retrylock"
    order = Order()
    fail = threading.Event()
    fail.set()

    def handler(ctx: Context, claim: Claim) -> None:
        order.start(claim.payload)
        if claim.payload == "d" and fail.is_set():
            raise RuntimeError("boom")

    e = engines(workers=3, poll_interval=0.05)
    e.register_kind(topic, handler, KindOptions(max_attempts=1))
    e.start()
    d = store.enqueue(Job(topic, "d", sequence="s")).id
    n1 = store.enqueue(Job(topic, "n1", sequence="s")).id
    n2 = store.enqueue(Job(topic, "n2", sequence="s")).id
    wait_for(lambda: state(store, d) is State.DEAD, "dead")
    fail.clear()
    with pool.connection() as conn, conn.transaction():
        conn.execute(f'SELECT 1 FROM "{schema}".job WHERE id = %s FOR UPDATE', (n1,))
        assert store.retry(d)
        wait_for(lambda: state(store, d) is State.DONE, "the retried member done beside the lock")
        assert state(store, n1) is State.BLOCKED
        assert state(store, n2) is State.BLOCKED
    wait_for(lambda: state(store, n2) is State.DONE, "the rest", timeout=60)
    assert order.started() == ["d", "d", "n1", "n2"]


def test_q5_retention_of_finished_members_and_a_future_member(
    store: Store, pool: ConnectionPool[Any], schema: str, engines: Callable[..., Engine]
) -> None:
    """Retention removing done members while later ones wait; a member due later holds the rest
    until it ran, and they follow in order."""
    topic = "at.ret"
    order = Order()

    def handler(ctx: Context, claim: Claim) -> None:
        order.start(claim.payload)

    e = engines(workers=3, poll_interval=0.05, retention_ttl=0.5, retention_period=0.2)
    e.register_kind(topic, handler)
    e.start()
    ids = [store.enqueue(Job(topic, f"a{n}", sequence="s")).id for n in range(3)]
    later = store.enqueue(
        Job(topic, "future", sequence="s", available_at=datetime.now(UTC) + timedelta(seconds=3))
    ).id
    after = [store.enqueue(Job(topic, f"b{n}", sequence="s")).id for n in range(3)]
    wait_for(lambda: store.get(ids[0]) is None, "retention removed the first members", timeout=30)
    wait_for(lambda: all(store.get(i) is None or state(store, i) is State.DONE for i in after), "rest", 60)
    assert order.started() == ["a0", "a1", "a2", "future", "b0", "b1", "b2"]
    assert later


def test_q5_a_running_member_canceled_by_psql_and_retried_at_once_runs_again_first_never_beside_itself(
    store: Store, pool: ConnectionPool[Any], schema: str, engines: Callable[..., Engine]
) -> None:
    topic = "at.cancelretry"
    lock = threading.Lock()
    runs: list[list[Any]] = []

    def handler(ctx: Context, claim: Claim) -> None:
        run = [claim.payload, time.monotonic(), None]
        with lock:
            runs.append(run)
        if claim.payload == "first" and len([r for r in runs if r[0] == "first"]) == 1:
            ctx.wait(30)
            time.sleep(1.0)  # winds down for a second after its cancel
        run[2] = time.monotonic()

    e1 = engines(workers=2, poll_interval=0.05)
    e1.register_kind(topic, handler)
    e2 = engines(workers=2, poll_interval=0.05)
    e2.register_kind(topic, handler)
    e1.start()
    e2.start()
    first = store.enqueue(Job(topic, "first", sequence="s")).id
    nxt = store.enqueue(Job(topic, "next", sequence="s")).id
    wait_for(lambda: len(runs) == 1, "the first member running")
    with pool.connection() as conn, conn.transaction():
        conn.execute(f"UPDATE \"{schema}\".job SET state = 'canceled' WHERE id = %s", (first,))
    assert store.retry(first)
    wait_for(lambda: state(store, nxt) is State.DONE, "the next member", timeout=60)
    assert state(store, first) is State.DONE
    with lock:
        got = [list(r) for r in runs]
    assert [r[0] for r in got] == ["first", "first", "next"], got
    assert got[1][1] >= got[0][2], "the retried member ran beside its canceled run"
    assert got[2][1] >= got[1][2]

"""Sequences (Q5) meeting depth caps that park (F3): nothing stalls (a member's turn may be passed, docs/sequences.md)."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from psycopg_pool import ConnectionPool

from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.queue import Claim, Context, Job, State
from tests.integration.conftest import q
from tests.polling import wait_for


def st(store: Store, job_id: str) -> State:
    row = store.get(job_id)
    assert row is not None
    return row.state


def ticks(store: Store, topic: str, n: int = 5) -> None:
    for _ in range(n):
        store.stage([topic], 1000)


def test_q5_f3_cancel_of_a_parked_first_member_lets_the_next_run(
    store: Store, pool: ConnectionPool[Any], schema: str, engines: Callable[..., Engine]
) -> None:
    """docs/sequences.md: 'A member canceled while it waits (blocked, pending, scheduled, parked)
    holds nothing'. m1 parked (head, 0022), cap lifted, m2 enqueued blocked behind it; cancel m1:
    m2 must run."""
    topic = "ps.cancelpark"
    store.set_max_depth(topic, 1, park=True)
    store.enqueue(Job(topic, "filler", available_at=datetime.now(UTC) + timedelta(hours=1)))
    m1 = store.enqueue(Job(topic, "m1", sequence="s")).id
    assert st(store, m1) is State.PARKED
    store.set_max_depth(topic, None)
    m2 = store.enqueue(Job(topic, "m2", sequence="s")).id
    assert st(store, m2) is State.BLOCKED
    store.cancel(m1)
    assert st(store, m1) is State.CANCELED
    ran: list[str] = []
    e = engines(workers=2, poll_interval=0.05)
    e.register_kind(topic, lambda ctx, claim: ran.append(claim.payload) and None)
    e.start()
    wait_for(
        lambda: st(store, m2) is State.DONE, "m2 runs after its parked predecessor is canceled", timeout=20
    )


def test_q5_f3_a_parked_first_member_whose_key_the_next_holds_stalls_nothing(
    store: Store, pool: ConnectionPool[Any], schema: str, engines: Callable[..., Engine]
) -> None:
    """m1 (key k) parked; the cap lifted; m2 of the same sequence with the same key k is enqueued:
    a parked job holds no key, so m2 is written blocked and holds k. 0022: m2 waits for m1 (the
    parked head); topic_parked_release: m1 waits for k to be free. Neither ever runs."""
    topic = "ps.keydead"
    store.set_max_depth(topic, 1, park=True)
    store.enqueue(Job(topic, "filler", available_at=datetime.now(UTC) + timedelta(hours=1)))
    m1 = store.enqueue(Job(topic, "m1", sequence="s", unique_key="k")).id
    assert st(store, m1) is State.PARKED
    store.set_max_depth(topic, None)
    r2 = store.enqueue(Job(topic, "m2", sequence="s", unique_key="k"))
    m2 = r2.id
    states_after_enqueue = (st(store, m1), st(store, m2))
    ran: list[str] = []
    e = engines(workers=2, poll_interval=0.05)
    e.register_kind(topic, lambda ctx, claim: ran.append(claim.payload) and None)
    e.start()
    wait_for(
        lambda: st(store, m1) is State.DONE,
        f"m1 runs (states after m2's enqueue {states_after_enqueue}); now {st(store, m1)}, {st(store, m2)}",
        timeout=20,
    )


def test_q5_f3_a_cap_set_again_stalls_no_member(
    store: Store, pool: ConnectionPool[Any], schema: str, engines: Callable[..., Engine]
) -> None:
    """cap 1 (park): m1 parked. The operator lifts the cap, a producer enqueues m2 (blocked, counted
    in the depth), the operator sets the cap again. m2 fills the depth; m1 gets no room; m2 waits
    for m1 (0022). Nothing runs, for ever (the filler is due in an hour)."""
    topic = "ps.reinstate"
    store.set_max_depth(topic, 1, park=True)
    filler = store.enqueue(Job(topic, "filler", available_at=datetime.now(UTC) + timedelta(hours=1))).id
    m1 = store.enqueue(Job(topic, "m1", sequence="s")).id
    assert st(store, m1) is State.PARKED
    store.set_max_depth(topic, None)
    m2 = store.enqueue(Job(topic, "m2", sequence="s")).id
    assert st(store, m2) is State.BLOCKED
    store.set_max_depth(topic, 1, park=True)  # the cap set again
    assert store.cancel(filler)  # nothing else waits: m2 (blocked) alone fills the cap
    e = engines(workers=2, poll_interval=0.05)
    e.register_kind(topic, lambda ctx, claim: None)
    e.start()
    wait_for(
        lambda: st(store, m1) is State.DONE,
        f"m1 runs under the reinstated cap; now {st(store, m1)}, {st(store, m2)}",
        timeout=20,
    )
    wait_for(lambda: st(store, m2) is State.DONE, "m2", timeout=20)


def test_q5_f3_a_locked_parked_member_holds_up_no_other_parked_job(
    store: Store, pool: ConnectionPool[Any], schema: str, engines: Callable[..., Engine]
) -> None:
    """Cap 3 (park). One sequence's parked member m2 is row-locked by an operator (psql); the members
    after it fill every candidate slot of the release (ORDER BY id LIMIT room), are then dropped by
    the freed filter, and the topic's non-sequence parked jobs enqueued later never get the room
    while the lock stays: one held row stops the topic's whole parked backlog."""
    topic = "ps.starve"
    store.set_max_depth(topic, 3, park=True)
    fill = [
        store.enqueue(Job(topic, f"f{i}", available_at=datetime.now(UTC) + timedelta(seconds=2))).id
        for i in range(3)
    ]
    ms = [store.enqueue(Job(topic, f"m{i}", sequence="s")).id for i in range(1, 8)]
    others = [store.enqueue(Job(topic, f"o{i}")).id for i in range(3)]
    assert all(st(store, i) is State.PARKED for i in ms + others)
    ran: list[str] = []
    with pool.connection() as conn, conn.transaction():
        conn.execute(f'SELECT 1 FROM "{schema}".job WHERE id = %s FOR UPDATE', (ms[0],))
        e = engines(workers=4, poll_interval=0.05)
        e.register_kind(topic, lambda ctx, claim: ran.append(claim.payload) and None)
        e.start()
        wait_for(lambda: all(st(store, i) is State.DONE for i in fill), "fillers", timeout=30)
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline and not all(st(store, i) is State.DONE for i in others):
            time.sleep(0.1)
        others_states = [st(store, i) for i in others]
    assert all(s is State.DONE for s in others_states), (
        f"non-sequence parked jobs stuck behind a locked member's sequence: {others_states}; ran {ran}"
    )


def test_q5_f3_parked_sequence_backlog_released_promptly(
    store: Store, pool: ConnectionPool[Any], schema: str, engines: Callable[..., Engine]
) -> None:
    """200 members of one sequence parked with the cap lifted: they must all run, in order, in a
    reasonable time (not one per poll)."""
    topic = "ps.backlog"
    store.set_max_depth(topic, 1, park=True)
    store.enqueue(Job(topic, "filler", available_at=datetime.now(UTC) + timedelta(hours=1)))
    for i in range(200):
        store.enqueue(Job(topic, i, sequence="s"))
    store.set_max_depth(topic, None)
    ran: list[int] = []
    e = engines(workers=4, poll_interval=0.5)
    e.register_kind(topic, lambda ctx, claim: ran.append(claim.payload) and None)
    e.start()
    wait_for(lambda: len(ran) == 200, "200 members", timeout=120)  # not one a poll: 100 s
    assert ran == list(range(200))


def test_q5_f3_parked_sequences_and_plain_jobs_cap_kept_order_kept(
    store: Store, pool: ConnectionPool[Any], schema: str, engines: Callable[..., Engine]
) -> None:
    """Cap 4 (park), 5 sequences x 10 members and 30 plain jobs interleaved; two engines. Each
    sequence runs in order, one at a time; the waiting count never goes over the cap by much."""
    topic = "ps.mix"
    store.set_max_depth(topic, 4, park=True)
    import threading

    lock = threading.Lock()
    running: dict[str, int] = {}
    overlaps: list[str] = []
    order: dict[str, list[int]] = {}
    done: list[Any] = []

    def handler(ctx: Context, claim: Claim) -> None:
        p = claim.payload
        if isinstance(p, list):
            s, i = p
            with lock:
                running[s] = running.get(s, 0) + 1
                if running[s] > 1:
                    overlaps.append(s)
                order.setdefault(s, []).append(i)
            time.sleep(0.01)
            with lock:
                running[s] -= 1
        with lock:
            done.append(p)

    n = 0
    for i in range(10):
        for s in range(5):
            store.enqueue(Job(topic, [f"s{s}", i], sequence=f"s{s}"))
            n += 1
        if i % 3 == 0:
            for k in range(10):
                store.enqueue(Job(topic, f"p{i}.{k}"))
                n += 1
    e1 = engines(workers=3, poll_interval=0.1)
    e2 = engines(workers=3, poll_interval=0.1)
    for e in (e1, e2):
        e.register_kind(topic, handler)
        e.start()
    peak = 0
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(done) < n:
        w = q(
            pool,
            schema,
            "SELECT count(*) FROM {job} WHERE topic = %s AND state IN ('pending','scheduled','failed','blocked')",
            topic,
        )[0][0]
        peak = max(peak, w)
        time.sleep(0.05)
    assert len(done) == n, (len(done), n)
    assert not overlaps, overlaps
    for s, seen in order.items():
        assert seen == list(range(10)), (s, seen)
    assert peak <= 4, peak


def test_q5_f3_cancel_of_a_parked_head_after_the_stager_saw_it(
    store: Store, pool: ConnectionPool[Any], schema: str, engines: Callable[..., Engine]
) -> None:
    """As the cancel test above, but the engine (its stager) already ran while m1 was the parked head
    (the owed release of m2's enqueue settled as 'nothing to release'); then m1 is canceled, its
    row locked by an operator meanwhile so the stager cannot release it first."""
    topic = "ps.cancelpark2"
    store.set_max_depth(topic, 1, park=True)
    store.enqueue(Job(topic, "filler", available_at=datetime.now(UTC) + timedelta(hours=1)))
    m1 = store.enqueue(Job(topic, "m1", sequence="s")).id
    assert st(store, m1) is State.PARKED
    e = engines(workers=2, poll_interval=0.05)
    e.register_kind(topic, lambda ctx, claim: None)
    with pool.connection() as conn, conn.transaction():
        conn.execute(f'SELECT 1 FROM "{schema}".job WHERE id = %s FOR UPDATE', (m1,))
        store.set_max_depth(topic, None)
        m2 = store.enqueue(Job(topic, "m2", sequence="s")).id
        assert st(store, m2) is State.BLOCKED
        e.start()
        wait_for(
            lambda: not q(pool, schema, f'SELECT 1 FROM "{schema}".job_sequence_due'),
            "owed releases settled",
            20,
        )
        conn.execute(
            f"UPDATE \"{schema}\".job SET state = 'canceled', updated_at = now() WHERE id = %s", (m1,)
        )
    assert st(store, m1) is State.CANCELED
    wait_for(
        lambda: st(store, m2) is State.DONE,
        f"m2 runs after its parked head was canceled; now {st(store, m2)}",
        timeout=20,
    )

"""The claim heads under attack (postgres/worker/heads.py, SPEC B1, C1): a batch committed behind
a topic's head drains at the claims' pace and in claim order, not one whole read a RESCAN while
newer rows and lower priorities go first (a whole read that took rows behind the head reads
whole again)."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg

from brooq_py.engine import Config, Engine
from brooq_py.postgres import Store
from brooq_py.postgres.worker.heads import RESCAN, ClaimHeads
from brooq_py.queue import Job
from tests.integration.test_claim_heads import Clock, claim


def test_c1_b1_a_slow_producers_batch_committed_behind_the_head_drains_at_the_claims_pace(
    dsn: str, store: Store
) -> None:
    """A producer's transaction stays open 2.5 s after its enqueue (a bulk import, a request that
    enqueues and then works) while other jobs of the topic are claimed: at its commit its 30 rows
    sort before the head by more than SLACK. They are the oldest ready rows of the topic (C1: they
    go first). A dispatcher claims again while its claims come back full; after one RESCAN it
    should take them all. The whole read takes `limit` of them, the next claim reads past the head
    and takes none: the rest wait one more RESCAN per `limit` rows (N rows: N/limit seconds)."""
    clock = Clock()
    store.worker._heads = ClaimHeads(clock=clock)
    store.enqueue(Job("t", "warm"))
    assert claim(store) == ["warm"]  # read whole: the head is set
    with psycopg.connect(dsn) as producer:
        store.enqueue_many([Job("t", f"slow-{i}") for i in range(30)], tx=producer)
        time.sleep(2.5)
        store.enqueue(Job("t", "fresh"))
        assert claim(store) == ["fresh"]  # past the head: the head is 2.5 s after the slow rows
        producer.commit()
    clock.now += RESCAN
    got: list[Any] = []
    while True:  # as the dispatcher does: claim again at once while a claim came back full
        rows = claim(store, 10)
        got += rows
        if len(rows) < 10:
            break
    assert len(got) == 30, f"one RESCAN claimed {len(got)} of the 30 oldest ready rows"


def test_c1_b1_an_engine_drains_a_late_committed_batch_within_a_rescan_and_a_poll(
    dsn: str, store: Store
) -> None:
    """The same with a started engine and real time: 60 jobs committed 2.5 s after their
    statement while a steady producer keeps the topic's head moving. Before the change the engine
    took them at once; with the heads it takes min(free slots, claim_batch) per second."""
    ran: dict[str, float] = {}
    lock = threading.Lock()

    def handler(ctx: Any, c: Any) -> None:
        with lock:
            ran[c.payload] = time.monotonic()

    engine = Engine(store, Config(workers=4, poll_interval=1))
    engine.register_kind("t", handler)
    engine.start()
    stop = threading.Event()

    def steady() -> None:
        i = 0
        while not stop.is_set():
            store.enqueue(Job("t", f"fresh-{i}"))
            i += 1
            stop.wait(0.1)

    producer_thread = threading.Thread(target=steady, daemon=True)
    try:
        producer_thread.start()
        time.sleep(1.5)  # the engine reads the topic whole, then past its head
        slow = [f"slow-{i}" for i in range(60)]
        with psycopg.connect(dsn) as producer:
            store.enqueue_many([Job("t", p) for p in slow], tx=producer)
            time.sleep(2.5)
            producer.commit()
        committed = time.monotonic()
        stop.set()
        producer_thread.join()
        deadline = committed + 8
        while time.monotonic() < deadline:
            with lock:
                if all(p in ran for p in slow):
                    break
            time.sleep(0.05)
        with lock:
            done = [p for p in slow if p in ran]
            last = max((ran[p] for p in done), default=committed)
        assert len(done) == len(slow), f"{len(done)} of {len(slow)} ran within 8 s of the commit"
        assert last - committed < 3.0, f"the batch took {last - committed:.1f} s after its commit"
    finally:
        stop.set()
        engine.close()


def test_c1_b1_lower_priority_rows_go_before_a_late_batch_of_the_usual_priority_for_more_than_a_rescan(
    dsn: str, store: Store
) -> None:
    """C1 puts priority first. The topic's usual priority is 5; a slow producer's 20 priority-5 rows
    commit behind the head while 30 priority-0 rows wait. Every claim between whole reads takes the
    priority-0 rows (the `lower` branch: the usual priority had too few past its head), and each
    whole read takes only `limit` of the priority-5 rows: after one RESCAN, priority-0 rows are
    still claimed while priority-5 rows are ready."""
    clock = Clock()
    store.worker._heads = ClaimHeads(clock=clock)
    store.enqueue(Job("t", "warm", priority=5))
    assert claim(store) == ["warm"]  # read whole: the head is (5, now)
    with psycopg.connect(dsn) as producer:
        store.enqueue_many([Job("t", f"slow-{i}", priority=5) for i in range(20)], tx=producer)
        time.sleep(2.5)
        store.enqueue(Job("t", "fresh", priority=5))
        assert claim(store) == ["fresh"]
        producer.commit()
    store.enqueue_many([Job("t", f"low-{i}", priority=0) for i in range(30)])
    clock.now += RESCAN
    order: list[Any] = []
    for _ in range(3):  # three claims of 10 within one RESCAN: C1 says the 20 priority-5 rows first
        order += claim(store, 10)
    assert order[:20] == [f"slow-{i}" for i in range(20)], order

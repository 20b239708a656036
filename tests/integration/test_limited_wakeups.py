"""A limited topic whose claim found no more ready jobs is claimed again as soon as one comes, with
poll_interval an hour: at its NOTIFY, even one landing while that claim ran; after the LISTEN
connection came back (a NOTIFY sent meanwhile is lost); at its stager's promotion without NOTIFY
(SPEC Q3, F1, Z3; engine/attempt/intake.py Capacity.notified)."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from psycopg_pool import ConnectionPool

from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.postgres.worker.repo import WorkerRepo
from brooq_py.queue import Job
from tests.budget import APP, MINE
from tests.integration.conftest import q, wait_listening


class Hooked(WorkerRepo):
    """Runs *hook* with each limited claim's answer, before the engine books it."""

    def __init__(self, *a: Any) -> None:
        super().__init__(*a)
        self.hook: Callable[[Any], None] | None = None

    def claim_limited(self, topic: str, limit: int, worker: str, lease: timedelta) -> Any:
        got = super().claim_limited(topic, limit, worker, lease)
        if self.hook is not None:
            self.hook(got)
        return got


def test_q3_a_notify_landing_while_the_drained_topics_claim_runs_is_not_lost(
    store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    store.set_rate_limit("r", 100, 1, burst=100)
    repo = Hooked(store.session, store.producer, store.flow)
    done = threading.Semaphore(0)
    e = engines(repo, poll_interval=3600, workers=4)
    e.register_kind("r", lambda ctx, claim: done.release())
    e.start()
    wait_listening(pool, store.schema)
    time.sleep(1.0)  # past the start-up claims
    armed = [True]

    def late(got: Any) -> None:  # the next claim of r that finds nothing
        if armed[0] and len(got) == 0 and got.drained:
            armed[0] = False
            store.enqueue(Job("r", "late"))  # committed after this claim's snapshot
            time.sleep(0.3)  # its NOTIFY reaches the listener before the answer is booked

    repo.hook = late
    store.enqueue(Job("r", 1))  # claimed at its NOTIFY; its settle brings r's next (empty) claim
    assert done.acquire(timeout=30)
    assert done.acquire(timeout=30), "the job announced during r's empty claim waits for the poll"


def test_q3_a_chain_of_jobs_of_a_limited_topic_never_stalls(
    store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """Each job enqueues the next 0-30 ms after it ran: its NOTIFY often lands during the empty claim
    that its own settle brings."""
    store.set_limit("r", 5)
    done = threading.Semaphore(0)
    rnd = random.Random(7)

    def h(ctx: Any, claim: Any) -> None:
        done.release()
        n = claim.payload
        if n < 60:
            threading.Timer(rnd.uniform(0.0, 0.03), lambda: store.enqueue(Job("r", n + 1))).start()

    e = engines(poll_interval=3600, workers=4)
    e.register_kind("r", h)
    e.start()
    wait_listening(pool, store.schema)
    time.sleep(1.0)
    store.enqueue(Job("r", 0))
    for i in range(61):
        assert done.acquire(timeout=30), f"the chain stalled at job {i}"


def test_z3_a_job_enqueued_while_the_listener_was_down_is_claimed(
    store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    store.set_limit("r", 5)
    done = threading.Semaphore(0)
    e = engines(poll_interval=3600, workers=4)
    e.register_kind("r", lambda ctx, claim: done.release())
    e.start()
    wait_listening(pool, store.schema)
    time.sleep(1.0)
    store.enqueue(Job("r", 0))
    assert done.acquire(timeout=30)
    time.sleep(1.0)  # r drained
    killed = q(
        pool,
        store.schema,
        f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE {MINE} AND state = 'idle'"
        " AND query ~ %s AND position(%s in query) > 0",
        APP,
        "^(--[^\n]*\n)*LISTEN ",
        store.schema,
    )
    assert killed, "no LISTEN connection found"
    store.enqueue(Job("r", 1))  # its NOTIFY finds no listener (the reconnect backs off)
    assert done.acquire(timeout=30), "the job enqueued while the listener was down waits the poll"


@pytest.mark.parametrize(("how", "notify"), [("rate", False), ("limit", False), ("rate", True)])
def test_q3_a_scheduled_job_of_a_drained_limited_topic_starts_on_time(
    store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine], how: str, notify: bool
) -> None:
    if how == "rate":
        store.set_rate_limit("r", 100, 1, burst=100)
    else:
        store.set_limit("r", 3)
    started: list[float] = []
    done = threading.Semaphore(0)

    def h(ctx: Any, claim: Any) -> None:
        started.append(time.monotonic())
        done.release()

    e = engines(poll_interval=3600, workers=4, notify=notify)
    e.register_kind("r", h)
    e.enqueue(Job("r", 0))
    e.start()
    if notify:
        wait_listening(pool, store.schema)
    assert done.acquire(timeout=30)
    time.sleep(1.5)  # r drained
    t0 = time.monotonic()
    e.enqueue(Job("r", 1, available_at=datetime.now(UTC) + timedelta(seconds=2)))
    assert done.acquire(timeout=30), "the scheduled job of r did not start"
    assert started[-1] - t0 < 15.0  # on time, give or take a loaded machine; not an hour


def started_engine(
    engines: Callable[..., Engine], pool: ConnectionPool[Any], store: Store, topic: str, h: Callable[..., Any]
) -> Engine:
    e = engines(poll_interval=3600, workers=4)
    e.register_kind(topic, h)
    e.start()
    wait_listening(pool, store.schema)
    return e


@pytest.mark.parametrize("tenant_limit", [None, 1])
def test_t1_a_tenant_topics_new_job_starts_at_its_notify(
    store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine], tenant_limit: int | None
) -> None:
    """A topic whose jobs name tenants is claimed as a limited one (job_claim_fair): its statements
    said no room, so it was never drained and its next job waited for the poll."""
    if tenant_limit is not None:
        store.set_tenant_limit("t", tenant_limit)
    done = threading.Semaphore(0)
    store.enqueue(Job("t", 0, tenant="A"))
    started_engine(engines, pool, store, "t", lambda ctx, claim: done.release())
    assert done.acquire(timeout=30)
    time.sleep(1.5)  # t's last claim found nothing
    store.enqueue(Job("t", 1, tenant="B"))
    assert done.acquire(timeout=30), "the tenant topic's new job waits for the poll"


def test_q2_a_paused_limited_topic_resumed_starts_its_jobs(
    store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """A paused topic's limited claim returns no row: it was put off for the poll, and the resume's
    NOTIFY changed nothing."""
    store.set_limit("r", 2)
    done = threading.Semaphore(0)
    started_engine(engines, pool, store, "r", lambda ctx, claim: done.release())
    store.enqueue(Job("r", 0))
    assert done.acquire(timeout=30)
    time.sleep(1.0)
    store.pause("r")
    store.enqueue(Job("r", 1))  # its NOTIFY has the paused topic claimed: nothing
    time.sleep(1.0)
    store.resume("r")  # NOTIFYs r
    assert done.acquire(timeout=30), "the resumed limited topic's job waits for the poll"


def test_q3_a_topic_limited_again_after_a_spell_unlimited_starts_its_jobs(
    store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """The putting-off of a claim at its limit outlived a spell without limit."""
    store.set_limit("r", 2)
    done = threading.Semaphore(0)
    gate = threading.Event()

    def h(ctx: Any, claim: Any) -> None:
        if claim.payload == "slow":
            gate.wait(30)
        done.release()

    e = started_engine(engines, pool, store, "r", h)
    store.enqueue_many([Job("r", "slow"), Job("r", "slow"), Job("r", "slow")])  # 2 taken: at its limit
    time.sleep(1.0)
    store.set_limit("r", None)
    e._topic_watch.run_once()  # as its poll would, sooner
    time.sleep(1.0)
    gate.set()
    for _ in range(3):
        assert done.acquire(timeout=30)
    store.set_limit("r", 2)
    e._topic_watch.run_once()
    time.sleep(1.0)
    store.enqueue(Job("r", "x"))
    assert done.acquire(timeout=30), "the topic limited again waits for the poll"

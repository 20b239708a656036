"""An idle engine makes the reads its claim heads owe, and then stops claiming (SPEC B1, C1;
postgres/worker/heads.py): claims of the owed topics alone, so paying one topic's debt never makes
another's, whatever the times at which each topic was read; a drained rate-limited topic leaves no
claim due either."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import pytest
from psycopg_pool import ConnectionPool

from brooq_py.engine import Engine
from brooq_py.postgres import Store
from brooq_py.postgres.worker import heads as heads_module
from brooq_py.postgres.worker.repo import WorkerRepo
from brooq_py.queue import Job, KindOptions
from brooq_py.queue.port import ClaimedJob
from tests.integration.conftest import wait_listening


class CountingRepo(WorkerRepo):
    """Records each common claim statement: when, and of which topics."""

    def __init__(self, *a: Any) -> None:
        super().__init__(*a)
        self.log: list[tuple[float, tuple[str, ...]]] = []

    def claim(self, topics: Sequence[str], limit: int, worker: str, lease: timedelta) -> list[ClaimedJob]:
        self.log.append((time.monotonic(), tuple(topics)))
        return super().claim(topics, limit, worker, lease)

    def since(self, t: float) -> list[tuple[float, tuple[str, ...]]]:
        return [x for x in self.log if x[0] >= t]


def claims_while_idle(repo: CountingRepo, seconds: float) -> list[tuple[float, tuple[str, ...]]]:
    """The common claims made in the next *seconds*: when (from now), and of which topics."""
    start = time.monotonic()
    time.sleep(seconds)
    return [(round(t - start, 3), topics) for t, topics in repo.since(start)]


def blocking() -> tuple[threading.Event, threading.Event, Callable[[Any, Any], None]]:
    """A handler that sets *started* and holds its slot until *release* is set (or 30 s)."""
    started, release = threading.Event(), threading.Event()

    def slow(ctx: Any, claim: Any) -> None:
        started.set()
        release.wait(30)

    return started, release, slow


def burst(repo: CountingRepo, done: threading.Semaphore, topics: Sequence[str], n: int) -> None:
    for i in range(n):
        for t in topics:
            repo.enqueue(Job(t, i))
        time.sleep(0.15)
    for _ in range(n * len(topics)):
        assert done.acquire(timeout=60)


def test_b1_an_idle_engine_with_a_capped_topic_stops_claiming(
    store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """A topic capped below the free slots is claimed in a statement of its own, a few ms from the
    common one: their owed reads fall due a few ms apart. Read together, each claim made for one's
    debt read the other narrow and owed another: about 4 claims a second for ever."""
    repo = CountingRepo(store.session, store.producer, store.flow)
    done = threading.Semaphore(0)
    e = engines(repo, poll_interval=3600, workers=4)
    e.register_kind("c", lambda ctx, claim: done.release(), KindOptions(concurrency=1))
    e.register_kind("a", lambda ctx, claim: done.release())
    e.start()
    wait_listening(pool, store.schema)
    burst(repo, done, ["c", "a"], 6)
    time.sleep(3.0)  # the wide reads the burst owes are made (each topic's whole read is a minute off)
    idle = claims_while_idle(repo, 10.0)
    assert len(idle) <= 2, idle[:12]


def test_b1_an_idle_engine_whose_topics_were_read_whole_apart_stops_claiming(
    store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two topics of one statement read from their start at different times (b empty when a was
    not): read together, each one's owed whole read read the other wide, which owed its whole read
    FULL_RESCAN later, for ever. FULL_RESCAN is 4 s here, to see three of them."""
    monkeypatch.setattr(heads_module, "FULL_RESCAN", 4.0)
    repo = CountingRepo(store.session, store.producer, store.flow)
    done = threading.Semaphore(0)
    e = engines(repo, poll_interval=3600, workers=4)
    e.register_kind("a", lambda ctx, claim: done.release())
    e.register_kind("b", lambda ctx, claim: done.release())
    e.start()
    wait_listening(pool, store.schema)
    time.sleep(1.5)
    burst(repo, done, ["a"], 1)  # a has a head
    time.sleep(1.7)
    burst(repo, done, ["b"], 1)  # b read whole, a wide: their whole reads are apart
    time.sleep(6.0)  # what the bursts owe is paid
    idle = claims_while_idle(repo, 12.0)
    assert len(idle) <= 2, idle[:12]


def test_f1_a_drained_rate_limited_topic_leaves_the_engine_idle(
    store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """The token the last claim waited for came and found nothing to take: that wait is over. Kept,
    in the past, it had the dispatcher claim in a tight loop (thousands of statements a second)."""
    store.set_rate_limit("r", 2, 1, burst=2)
    repo = CountingRepo(store.session, store.producer, store.flow)
    done = threading.Semaphore(0)
    e = engines(repo, poll_interval=3600)
    e.register_kind("r", lambda ctx, claim: done.release())
    e.register_kind("a", lambda ctx, claim: done.release())
    for i in range(3):  # two at once, the third at the next token (0.5 s), then nothing left
        repo.enqueue(Job("r", i))
    e.start()
    wait_listening(pool, store.schema)
    for _ in range(3):
        assert done.acquire(timeout=60)
    time.sleep(2.0)
    idle = claims_while_idle(repo, 3.0)
    assert len(idle) <= 2, f"{len(idle)} claims in 3 s idle"


def test_b1_two_idle_engines_sharing_a_store_stop_claiming(
    store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """Both engines' waits for the topic's owed read end together; one takes it, and the other, with
    nothing left to take, went on to a full claim that read the topic narrow and owed another:
    two claims a second for ever."""
    repo = CountingRepo(store.session, store.producer, store.flow)
    done = threading.Semaphore(0)
    made = [engines(repo, poll_interval=3600, workers=4) for _ in range(2)]
    for e in made:
        e.register_kind("a", lambda ctx, claim: done.release())
        e.start()
    wait_listening(pool, store.schema, engines=2)
    burst(repo, done, ["a"], 4)
    time.sleep(3.0)
    idle = claims_while_idle(repo, 10.0)
    assert len(idle) <= 4, idle[:12]


def test_f1_a_capped_rate_limited_topic_at_its_cap_leaves_the_engine_idle(
    store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """Its token falls due while its one slot is taken: the plan skips it, the token's time stays in
    the past, and the dispatcher claimed the other topics in a tight loop until the job ended."""
    store.set_rate_limit("r", 1, 1, burst=1)
    repo = CountingRepo(store.session, store.producer, store.flow)
    started, release, slow = blocking()
    e = engines(repo, poll_interval=3600, workers=4)
    e.register_kind("r", slow, KindOptions(concurrency=1))
    e.register_kind("a", lambda ctx, claim: None)
    for i in range(3):
        repo.enqueue(Job("r", i))
    e.start()
    try:
        wait_listening(pool, store.schema)
        assert started.wait(30)
        time.sleep(1.5)  # its next token is due
        idle = claims_while_idle(repo, 2.5)
        assert len(idle) <= 5, f"{len(idle)} common claims in 2.5 s while r is at its cap"
    finally:
        release.set()


class LimitedCounting(CountingRepo):
    """Counts the limited claims too."""

    def __init__(self, *a: Any) -> None:
        super().__init__(*a)
        self.limited: list[tuple[float, str, int]] = []

    def claim_limited(self, topic: str, limit: int, worker: str, lease: timedelta) -> Any:
        got = super().claim_limited(topic, limit, worker, lease)
        self.limited.append((time.monotonic(), topic, len(got)))
        return got


def test_f1_a_new_job_of_a_drained_rate_limited_topic_starts_at_its_notify(
    store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """The last claim of the topic found no more ready rows: it waited poll_interval (an hour here)
    before looking again, whatever was enqueued meanwhile. Its NOTIFY now has it claimed."""
    store.set_rate_limit("r", 2, 1, burst=2)
    done = threading.Semaphore(0)
    e = engines(poll_interval=3600, workers=4)
    e.register_kind("r", lambda ctx, claim: done.release())
    e.register_kind("a", lambda ctx, claim: done.release())
    for i in range(3):
        store.enqueue(Job("r", i))
    e.start()
    wait_listening(pool, store.schema)
    for _ in range(3):
        assert done.acquire(timeout=60)
    time.sleep(2.0)  # its claims found it drained
    store.enqueue(Job("r", 99))
    assert done.acquire(timeout=30), "a new job of r was not claimed"


def test_q3_notifies_of_a_limited_topic_at_its_limit_claim_it_no_more_often(
    store: Store, pool: ConnectionPool[Any], engines: Callable[..., Engine]
) -> None:
    """At its limit a claim takes nothing with ready rows left: not drained, so the NOTIFY of each
    new job claims it no sooner than before (a settle, or retry_after)."""
    store.set_limit("l", 1)
    repo = LimitedCounting(store.session, store.producer, store.flow)
    started, release, slow = blocking()
    e = engines(repo, poll_interval=3600, workers=4)
    e.register_kind("l", slow)
    repo.enqueue(Job("l", 0))
    e.start()
    try:
        wait_listening(pool, store.schema)
        assert started.wait(30)
        time.sleep(0.5)
        start = time.monotonic()
        for i in range(20):
            repo.enqueue(Job("l", i + 1))
            time.sleep(0.1)
        time.sleep(1.0)
        tried = [x for x in repo.limited if x[0] >= start]
        assert len(tried) <= 3, tried
    finally:
        release.set()

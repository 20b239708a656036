"""The stager against the in-memory repo (SPEC S7, Z3): promotes, repeats while full, sleeps until due."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta

import pytest

from brooq_py.engine import Config, Engine
from brooq_py.engine.services.wakeups import Stager
from brooq_py.queue import Claim, Context, Job, State
from brooq_py.queue.port import Staged
from tests.polling import wait_for
from tests.unit.fake_repo import FakeRepo

LOG = logging.getLogger("stager-test")


def later(seconds: float) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


class Woken:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


def stager(repo: FakeRepo, woken: Woken, *, batch: int = 1000, period: float = 30.0) -> Stager:
    return Stager(period, ["a"], repo.stage, repo.next_due, woken, LOG, batch=batch)


@pytest.fixture
def repo() -> FakeRepo:
    return FakeRepo()


def test_s5_a_future_enqueue_is_scheduled_and_not_claimed(repo: FakeRepo) -> None:
    job = repo.enqueue(Job("a", 1, available_at=later(60))).id
    assert repo.row(job).state is State.SCHEDULED
    assert repo.claim(["a"], 5, "w", timedelta(seconds=30)) == []


def test_s7_stager_promotes_due_rows_and_wakes_the_dispatcher(repo: FakeRepo) -> None:
    woken = Woken()
    # scheduled far ahead, then made due: a due time near enough could pass before the enqueue
    due = repo.enqueue(Job("a", 1, available_at=later(60))).id
    waiting = repo.enqueue(Job("a", 2, available_at=later(60))).id
    other = repo.enqueue(Job("b", 3, available_at=later(60))).id
    s = stager(repo, woken)
    s.run_once()
    assert woken.count == 0 and repo.row(due).state is State.SCHEDULED
    repo.row(due).available_at = repo.row(other).available_at = repo.now() - 1.0
    assert (repo.next_due(["a"]) or 1) < 0
    s.run_once()
    assert repo.row(due).state is State.PENDING and woken.count == 1
    assert repo.row(waiting).state is State.SCHEDULED
    assert repo.row(other).state is State.SCHEDULED  # not one of our topics
    assert s.next_delay() == s.period  # the next due row is a minute away: sleep the poll interval


def test_s7_a_full_batch_is_repeated_in_the_same_tick(repo: FakeRepo) -> None:
    woken = Woken()
    for i in range(25):  # scheduled, each of them (a due time near enough could pass mid-loop)
        repo.enqueue(Job("a", i, available_at=later(60)))
    due = repo.now() - 1.0
    for r in repo.rows.values():  # then due, at one time
        r.available_at = due
    s = stager(repo, woken, batch=10)
    s.run_once()
    assert repo.calls["stage"] == 3  # 10, 10, 5: the short batch ends the tick
    assert all(r.state is State.PENDING for r in repo.rows.values())
    assert woken.count == 3


def test_s7_next_delay_is_the_earliest_due_time_at_most_the_period(repo: FakeRepo) -> None:
    s = stager(repo, Woken(), period=5.0)
    s.run_once()
    assert s.next_delay() == 5.0  # nothing waits: the poll interval
    repo.enqueue(Job("a", 1, available_at=later(2)))
    s.run_once()
    assert 1.0 < s.next_delay() <= 2.1
    repo.enqueue(Job("a", 1, available_at=later(60)))
    s.run_once()
    assert s.next_delay() <= 2.1


def test_s7_a_wake_reads_the_due_time_without_staging(repo: FakeRepo) -> None:
    s = stager(repo, Woken(), period=3600.0)
    s.run_once()
    stages = repo.calls["stage"]
    repo.enqueue(Job("a", 1, available_at=later(60)))  # far enough ahead to stay scheduled here
    s.wake()
    s.run_once()
    assert repo.calls["stage"] == stages and repo.calls["next_due"] == 1
    assert 30 < s.next_delay() <= 60.1  # the due time, not the period


def test_s7_a_sleeping_stager_is_woken_by_wake_and_stopped_by_stop(repo: FakeRepo) -> None:
    calls: list[int] = []

    def next_due(topics: Sequence[str]) -> float | None:
        calls.append(1)
        return None

    s = Stager(3600, ["a"], lambda t, b: Staged({}, None), next_due, Woken(), LOG)
    s.start()
    try:
        s.wake()
        wait_for(lambda: calls, "the wake-up read the due time")
    finally:
        s.stop(5)
    assert not s.running


@pytest.fixture
def started(repo: FakeRepo) -> Iterator[list[Engine]]:
    engines: list[Engine] = []
    yield engines
    for e in engines:
        e.stop(1)


def test_s7_an_idle_engine_runs_a_scheduled_job_at_its_time(repo: FakeRepo, started: list[Engine]) -> None:
    ran = threading.Event()

    def handler(ctx: Context, claim: Claim) -> None:
        ran.set()

    # poll_interval 1 h: only the enqueue's wake-up and the due-time sleep bring the job in
    e = Engine(repo, Config(workers=1, poll_interval=3600, lease=3))
    e.register_kind("a", handler)
    e.start()
    started.append(e)
    wait_for(lambda: repo.calls.get("stage"), "the stager's first tick")
    repo.enqueue(Job("a", 1, available_at=later(0.3)))
    assert ran.wait(10)


def test_s7_run_once_stages_due_rows_before_claiming(repo: FakeRepo) -> None:
    seen: list[int] = []
    job = repo.enqueue(Job("a", 1, available_at=later(60))).id  # scheduled, then due
    assert repo.row(job).state is State.SCHEDULED
    repo.row(job).available_at = repo.now() - 1.0
    e = Engine(repo, Config(workers=1, lease=3))
    e.register_kind("a", lambda ctx, claim: seen.append(claim.payload))
    assert e.run_once() == 1 and seen == [1] and repo.row(job).state is State.DONE


def test_z3_notify_off_means_no_listen(repo: FakeRepo, started: list[Engine]) -> None:
    ran = threading.Event()
    e = Engine(repo, Config(workers=1, poll_interval=0.05, lease=3, notify=False))
    e.register_kind("a", lambda ctx, claim: ran.set())
    e.start()
    started.append(e)
    repo.enqueue(Job("a", 1))
    assert ran.wait(10)  # polling carries the work
    assert "listen" not in repo.calls


def test_z3_the_listener_wakes_only_for_its_topics(repo: FakeRepo) -> None:
    scheduled = Woken()
    sub = repo.listen(["a"], scheduled)
    repo.enqueue(Job("b", 1))
    assert sub.wait(0.05) is False
    repo.enqueue(Job("b", 1, available_at=later(60)))
    assert sub.wait(0.05) is False and scheduled.count == 0
    repo.enqueue(Job("a", 1, available_at=later(60)))
    assert sub.wait(0.05) is False and scheduled.count == 1
    repo.enqueue(Job("a", 1))
    assert sub.wait(1) is True


def test_s7_a_failing_database_is_retried_every_period_not_in_a_busy_loop(repo: FakeRepo) -> None:
    s = stager(repo, Woken(), period=7.0)
    repo.enqueue(Job("a", 1, available_at=later(60)))
    s.run_once()
    assert 0 < s.next_delay() <= 7.0  # the job is a minute away
    s._learn(0.0)  # as if it were due now (a near due time could pass before the enqueue, here)
    wait_for(lambda: s.next_delay() == 0.0, "the job is due")

    def broken(topics: Sequence[str], batch: int) -> Staged:
        raise ConnectionError("down")

    s._stage = broken
    with pytest.raises(ConnectionError):
        s.run_once()
    assert s.next_delay() == 7.0

"""The refresher, the snapshot collector and health from memory, on the fake repo (SPEC Z2, O1, C5)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

from brooq_py.engine import Config, Engine
from brooq_py.engine.health import StatementTracker, tracked
from brooq_py.engine.metrics import EngineRegistry
from brooq_py.queue import InvalidJob, Job, State
from brooq_py.queue.port import DatabaseGauges
from tests.polling import wait_for
from tests.unit.fake_repo import FakeRepo


class ManualClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def monotonic(self) -> float:
        return self.t

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.t, UTC)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def engine(clock: ManualClock) -> Iterator[Engine]:
    e = Engine(FakeRepo(), Config(workers=1, poll_interval=0.05, gauges_period=0.05), clock=clock)
    e.register_kind("a", lambda ctx, claim: None)
    e.register_kind("b", lambda ctx, claim: None)
    try:
        yield e
    finally:
        e.close()


def fake(e: Engine) -> FakeRepo:
    repo = getattr(e.repo, "inner")
    assert isinstance(repo, FakeRepo)
    return repo


def scrape(e: Engine, name: str, labels: dict[str, str] | None = None) -> float | None:
    return e.registry.get_sample_value(name, labels or {})


def test_z2_scrapes_read_the_snapshot_and_never_the_repo(engine: Engine, clock: ManualClock) -> None:
    """SPEC Z2, O1: one refresh reads the gauges; any number of scrapes afterwards queries nothing."""
    repo = fake(engine)
    ids = [engine.enqueue(Job("a")).id for _ in range(3)]
    engine.enqueue(Job("b"))
    repo.row(ids[0]).state = State.SCHEDULED
    repo.row(ids[1]).state = State.FAILED
    repo.database = DatabaseGauges(
        oldest_transaction_seconds=42.5, job_dead_tuples=7, job_live_tuples=9, job_inserted=1234
    )
    engine.refresher.run_once()
    calls = dict(repo.calls)
    assert calls["gauges"] == 1 and calls["database_gauges"] == 1
    clock.t += 3
    for _ in range(100):
        text = generate_latest(engine.registry)
    assert repo.calls == calls, "a scrape reached the repo"
    assert b"brooq_jobs" in text
    expected = {
        ("a", "pending"): 1,
        ("a", "scheduled"): 1,
        ("a", "failed"): 1,
        ("a", "processing"): 0,
        ("b", "pending"): 1,
        ("b", "scheduled"): 0,
    }
    for (topic, state), n in expected.items():
        assert scrape(engine, "brooq_jobs", {"topic": topic, "state": state}) == n, (topic, state)
    assert scrape(engine, "brooq_oldest_transaction_age_seconds") == 42.5
    assert scrape(engine, "brooq_job_dead_tuples") == 7
    assert scrape(engine, "brooq_job_live_tuples") == 9
    assert scrape(engine, "brooq_job_inserted_total") == 1234
    assert scrape(engine, "brooq_ready_oldest_age_seconds", {"topic": "a"}) == 0.0
    assert scrape(engine, "brooq_gauges_age_seconds") == 3.0
    assert scrape(engine, "brooq_up") == 1.0


def test_z2_a_failed_refresh_keeps_the_last_snapshot_and_marks_it_stale(
    engine: Engine, clock: ManualClock
) -> None:
    """SPEC Z2: the database failing keeps the last numbers served, brooq_up 0, their age growing."""
    repo = fake(engine)
    engine.enqueue(Job("a"))
    engine.refresher.run_once()
    assert engine.refresher.view().fresh
    repo.fail_gauges = 1
    clock.t += 10
    with pytest.raises(ConnectionError):
        engine.refresher.run_once()
    view = engine.refresher.view()
    assert not view.fresh and view.snapshot is not None and view.age == 10.0
    assert scrape(engine, "brooq_up") == 0.0
    assert scrape(engine, "brooq_jobs", {"topic": "a", "state": "pending"}) == 1.0
    assert scrape(engine, "brooq_gauges_age_seconds") == 10.0
    engine.refresher.run_once()
    assert scrape(engine, "brooq_up") == 1.0
    assert scrape(engine, "brooq_gauges_age_seconds") == 0.0


def test_z2_before_the_first_refresh_gauges_are_named_without_samples(engine: Engine) -> None:
    """SPEC Z2: nothing read yet is not zero jobs: no sample, brooq_up 0, the names still listed."""
    text = generate_latest(engine.registry).decode()
    assert "# TYPE brooq_jobs gauge" in text and "# TYPE brooq_job_dead_tuples gauge" in text
    assert scrape(engine, "brooq_jobs", {"topic": "a", "state": "pending"}) is None
    assert scrape(engine, "brooq_up") == 0.0
    assert fake(engine).calls.get("gauges", 0) == 0


def test_z2_the_refresher_runs_with_the_engine_and_stops_with_it(engine: Engine) -> None:
    """SPEC Z2: started by start() (an initial refresh at once, then every gauges_period), stopped by stop()."""
    repo = fake(engine)
    engine.start()
    wait_for(lambda: repo.calls.get("gauges", 0) >= 3, "three refreshes")
    engine.stop(1)
    after = repo.calls["gauges"]
    threading.Event().wait(0.3)
    assert repo.calls["gauges"] == after


def test_o1_metrics_expose_no_created_series_and_leave_other_registries_alone(engine: Engine) -> None:
    """/metrics has no *_created series; prometheus_client's process-wide switch is left as it was."""
    engine.enqueue(Job("a"))
    engine.run_once()
    text = generate_latest(engine.registry).decode()
    assert "brooq_settle_total" in text and "brooq_attempt_duration_seconds_count" in text
    assert "_created" not in text
    other = CollectorRegistry()
    Counter("app_things", "An application's own counter.", registry=other).inc()
    assert "app_things_created" in generate_latest(other).decode()


def test_o1_engine_registry_keeps_gauges_named_created() -> None:
    """Only counter/summary/histogram *_created samples go: a gauge of that name is data."""
    from prometheus_client import Gauge

    reg = EngineRegistry()
    Gauge("thing_created", "A gauge whose name ends in _created.", registry=reg).set(3)
    assert reg.get_sample_value("thing_created") == 3


# --- health from memory ------------------------------------------------------------------------


def test_z2_statement_tracker_judges_failures_by_their_duration(clock: ManualClock) -> None:
    """SPEC Z2: failing longer than the grace is unhealthy; never having succeeded is unhealthy at once."""
    t = StatementTracker(clock)
    assert t.status(10, 100).ok  # nothing ran: nothing against it
    t.ended(t.started("claim"), "claim", RuntimeError("relation does not exist"))
    s = t.status(10, 100)
    assert not s.ok and s.error == "claim: RuntimeError" and s.last_success_age is None
    t.ended(t.started("claim"), "claim", None)
    assert t.status(10, 100).ok
    clock.t += 1
    t.ended(t.started("claim"), "claim", ConnectionError("down"))
    clock.t += 9.5
    t.ended(t.started("claim"), "claim", ConnectionError("down"))
    assert t.status(10, 100).ok  # failing for 9.5 s: still within the grace
    clock.t += 1
    t.ended(t.started("claim"), "claim", ConnectionError("down"))
    s = t.status(10, 100)
    assert not s.ok and s.failing_for == 10.5 and s.last_success_age == 11.5
    t.ended(
        t.started("claim"), "claim", InvalidJob("bad payload")
    )  # the caller's mistake: the database answered
    assert t.status(10, 100).ok


def test_z2_one_statement_succeeding_does_not_hide_another_that_keeps_failing(clock: ManualClock) -> None:
    """SPEC Z2: on an unmigrated schema the statistics read works and every claim fails: unhealthy."""
    t = StatementTracker(clock)
    for _ in range(20):
        t.ended(t.started("claim"), "claim", RuntimeError("relation does not exist"))
        t.ended(t.started("database_gauges"), "database_gauges", None)
        clock.t += 1
    s = t.status(10, 100)
    assert not s.ok and s.error == "claim: RuntimeError"


def test_z2_a_lone_failure_of_a_rare_statement_does_not_pin_health(clock: ManualClock) -> None:
    """A statement that runs once an hour (retention) and failed once is not unhealthy for the hour."""
    t = StatementTracker(clock)
    t.ended(t.started("delete_terminal"), "delete_terminal", None)
    t.ended(t.started("delete_terminal"), "delete_terminal", RuntimeError("lock timeout"))
    assert t.status(10, 100).ok
    clock.t += 60
    assert t.status(10, 100).ok


def test_z2_a_failing_statement_blocked_in_its_retry_still_counts(clock: ManualClock) -> None:
    """A claim that failed and now waits (for a pool connection) is still failing, not recovered."""
    t = StatementTracker(clock)
    t.ended(t.started("claim"), "claim", None)
    t.ended(t.started("claim"), "claim", ConnectionError("server closed the connection"))
    t.started("claim")  # blocked: no answer yet
    clock.t += 30
    s = t.status(10, 100)
    assert not s.ok and s.error == "claim: ConnectionError"


def test_z2_a_statement_stalled_past_the_bound_is_unhealthy(clock: ManualClock) -> None:
    """SPEC Z2, L3: a statement in flight longer than the stall bound (the lease) fails health."""
    t = StatementTracker(clock)
    token = t.started("claim")
    clock.t += 50
    assert t.status(10, 60).ok
    clock.t += 11
    s = t.status(10, 60)
    assert not s.ok and s.error == "statement stalled"
    t.ended(token, "claim", None)
    assert t.status(10, 60).ok


def test_z2_tracked_repo_counts_every_statement_but_not_listen_or_begin(clock: ManualClock) -> None:
    repo = FakeRepo()
    t = StatementTracker(clock)
    r = tracked(repo, t)
    r.enqueue(Job("a"))
    r.gauges(["a"])
    r.listen().close()
    with r.begin():
        pass
    assert t.calls == 2
    repo.fail_gauges = 1
    with pytest.raises(ConnectionError):
        r.gauges(["a"])
    assert t.calls == 3 and t.status(10, 100).ok  # one failure after a success: within the grace


def test_z2_healthz_turns_unhealthy_when_every_statement_fails(
    engine: Engine, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 9 item 8 / SPEC Z2: an engine whose statements all fail (an unmigrated schema) is not ok."""
    caplog.set_level(logging.CRITICAL)
    repo = fake(engine)

    def broken(*args: object, **kwargs: object) -> list[object]:
        raise RuntimeError('relation "public.job" does not exist')

    repo.claim = broken  # type: ignore[method-assign]
    repo.gauges = broken  # type: ignore[method-assign]
    engine.start()
    health = wait_for(lambda: (h := engine.health()).error is not None and h, "a failed statement")
    assert not health.ok and not health.database and health.running
    assert health.to_json()["error"] in ("claim: RuntimeError", "gauges: RuntimeError")


def test_z2_tracked_repo_forwards_attributes_and_survives_a_copy(clock: ManualClock) -> None:
    import copy

    repo = FakeRepo()
    r = tracked(repo, StatementTracker(clock))
    assert getattr(r, "rows") is repo.rows  # plain attributes pass through, untracked
    assert getattr(r, "inner") is repo
    copy.copy(r)  # no recursion through a missing _repo


def test_z2_an_applications_own_failing_calls_do_not_turn_health(clock: ManualClock) -> None:
    """Engine.enqueue_tx in a transaction the application broke, or blocked on its own lock,
    is the application's: health turns on the engine's statements only."""
    t = StatementTracker(clock)
    for _ in range(20):
        t.ended(t.started("enqueue_tx"), "enqueue_tx", RuntimeError("current transaction is aborted"))
        clock.t += 1
    t.started("enqueue_tx")  # waits on a row lock the application holds
    clock.t += 1000
    assert t.status(10, 100).ok
    t.ended(t.started("claim"), "claim", RuntimeError("down"))
    assert not t.status(10, 100).ok  # the engine's own statement never succeeded


def test_z2_o1_a_scrapes_queue_full_count_is_no_statement_of_the_engine(clock: ManualClock) -> None:
    """/metrics reads the Store's QueueFull refusals from its memory: that read is no statement, so a
    scrape neither counts as one nor tells health that the database answered."""

    class Refusing(FakeRepo):
        def queue_full_refusals(self) -> dict[str, int]:
            return {"a": 2}

    e = Engine(Refusing(), Config(workers=1), clock=clock)
    try:
        t = e.statements
        t.ended(t.started("claim"), "claim", RuntimeError("down"))
        before = t.calls
        for _ in range(5):
            text = generate_latest(e.registry)
        assert b'brooq_queue_full_total{topic="a"} 2.0' in text
        assert t.calls == before
        assert not t.status(10, 100).ok  # still the failed claim, not a scrape's read
    finally:
        e.close()

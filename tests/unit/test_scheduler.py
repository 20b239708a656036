"""Periodic jobs (SPEC Q4): cron parsing, tick keys and the make-up rule, on a fake clock."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from brooq_py.engine import Engine
from brooq_py.engine.services.scheduler import Schedule, Scheduler, tick_key
from brooq_py.queue import BrooqError, ConfigError, EnqueueResult, Job
from tests.unit.fake_repo import FakeRepo

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


class Harness:
    def __init__(self, *schedules: Schedule, now: datetime = T0) -> None:
        self.now = now
        self.jobs: list[Job] = []
        self.keys: set[tuple[str, str | None]] = set()
        self.next: dict[str, float] = {}
        self.fail = False
        self.last: dict[str, datetime] = {}  # the schedule_tick table: the last tick per schedule
        self.scheduler = Scheduler(
            list(schedules),
            self.enqueue_tick,
            lambda: self.now,
            self.next.__setitem__,
            logging.getLogger("t"),
        )

    def enqueue_tick(self, schedule: str, tick: datetime, job: Job) -> EnqueueResult | None:
        """As the database does it: only a tick ahead of the schedule's last goes in, with its job."""
        if self.fail:
            raise ConnectionError("down")
        instant = tick.astimezone(
            UTC
        )  # timestamptz compares instants; one zone's datetimes compare wall times
        if schedule in self.last and self.last[schedule] >= instant:
            return None
        self.last[schedule] = instant
        created = (job.topic, job.key) not in self.keys
        self.keys.add((job.topic, job.key))
        if created:
            self.jobs.append(job)
        return EnqueueResult("id", created)

    def at(self, now: datetime) -> None:
        self.now = now
        self.scheduler.run_once()


def sched(cron: str, tz: str = "UTC", payload: Any = None) -> Schedule:
    return Schedule.build("t", cron, payload, tz, 0)


def test_q4_five_fields_hourly_and_six_fields_with_leading_seconds() -> None:
    assert sched("0 * * * *").after(T0) == T0 + timedelta(hours=1)
    assert sched("*/2 * * * * *").after(T0) == T0 + timedelta(seconds=2)


@pytest.mark.parametrize(
    "cron, tz",
    [
        ("61 * * * *", "UTC"),
        ("* * *", "UTC"),
        ("* * * * * * *", "UTC"),
        (5, "UTC"),
        ("* * * * *", "Mars/Base"),
    ],
)
def test_q4_bad_expression_or_time_zone_raises_config_error_at_once(cron: Any, tz: str) -> None:
    with pytest.raises(ConfigError):
        Schedule.build("t", cron, None, tz, 0)
    e = Engine(FakeRepo())
    with pytest.raises(ConfigError):
        e.schedule("t", cron, timezone=tz)


def test_q4_bad_payload_priority_topic_and_a_second_schedule_of_a_topic_raise_config_error() -> None:
    e = Engine(FakeRepo())
    with pytest.raises(ConfigError):
        e.schedule("t", "* * * * *", {1, 2})
    with pytest.raises(ConfigError):
        e.schedule("t", "* * * * *", priority=2**40)
    with pytest.raises(ConfigError):
        e.schedule("", "* * * * *")
    e.schedule("t", "* * * * *")
    with pytest.raises(ConfigError):
        e.schedule("t", "0 * * * *")


def test_q4_schedule_after_start_is_refused() -> None:
    e = Engine(FakeRepo())
    e.start()
    try:
        with pytest.raises(BrooqError):
            e.schedule("t", "* * * * *")
    finally:
        e.stop(timeout=1)


def test_q4_tick_key_is_the_tick_in_utc_whatever_the_time_zone() -> None:
    paris = sched("0 3 * * *", "Europe/Paris")
    tick = paris.after(T0)
    assert tick.utcoffset() == timedelta(hours=1)
    assert tick_key(tick) == "cron:2026-03-02T02:00:00+00:00"
    assert paris.job(tick).key == tick_key(tick)


def test_q4_each_tick_is_enqueued_once_as_time_passes() -> None:
    h = Harness(sched("*/10 * * * * *"), now=T0 + timedelta(seconds=3))
    h.scheduler.run_once()  # start-up: 12:00:00 is 3 s old, at most one period: made up
    for s in range(4, 45):
        h.at(T0 + timedelta(seconds=s))
    assert [j.key for j in h.jobs] == [tick_key(T0 + timedelta(seconds=s)) for s in (0, 10, 20, 30, 40)]
    assert h.next["t"] == (T0 + timedelta(seconds=50)).timestamp()


def test_q4_at_start_only_the_latest_missed_tick_is_made_up_if_at_most_one_period_old() -> None:
    # an hourly job started 20 minutes after its tick: made up, once
    h = Harness(sched("0 * * * *"), now=T0 + timedelta(minutes=20))
    h.scheduler.run_once()
    h.at(T0 + timedelta(minutes=21))
    assert [j.key for j in h.jobs] == [tick_key(T0)]
    # 09-17 hourly, started at 23:00: the 17:00 tick is six hours old, more than its hour: not made up
    late = Harness(sched("0 9-17 * * *"), now=T0.replace(hour=23))
    late.scheduler.run_once()
    assert late.jobs == []
    assert late.next["t"] == T0.replace(day=2, hour=9).timestamp()


def test_q4_ticks_missed_while_running_late_are_made_up_once_the_latest() -> None:
    h = Harness(sched("* * * * * *"), now=T0)
    h.scheduler.run_once()
    h.at(T0 + timedelta(seconds=30, microseconds=500))  # thirty ticks missed (a long pause)
    assert [j.key for j in h.jobs] == [tick_key(T0), tick_key(T0 + timedelta(seconds=30))]


def test_q4_a_failed_enqueue_is_tried_again_soon_and_then_the_latest_tick_goes_in() -> None:
    h = Harness(sched("*/5 * * * * *"), now=T0 + timedelta(seconds=1))
    h.fail = True
    h.scheduler.run_once()
    assert h.scheduler.next_delay() == 1.0
    h.fail = False
    h.at(T0 + timedelta(seconds=2))
    assert [j.key for j in h.jobs] == [tick_key(T0)]
    assert 0 < h.scheduler.next_delay() <= 3.01


def test_q4_two_schedulers_and_a_restart_make_one_job_per_tick() -> None:
    shared = Harness(sched("*/2 * * * * *"), now=T0)

    def another() -> Scheduler:
        return Scheduler(
            [sched("*/2 * * * * *")],
            shared.enqueue_tick,
            lambda: shared.now,
            lambda t, v: None,
            logging.getLogger("t"),
        )

    other = another()
    for s in range(0, 20):
        shared.now = T0 + timedelta(seconds=s, milliseconds=7 * s)
        shared.scheduler.run_once()
        other.run_once()
        if s == 10:  # a restart of one: a fresh scheduler makes up the latest tick, already there
            other = another()
    assert [j.key for j in shared.jobs] == [tick_key(T0 + timedelta(seconds=s)) for s in range(0, 20, 2)]


def test_q4_dst_fall_back_every_tick_of_the_repeated_hour_is_enqueued() -> None:
    """Scenario: an engine in Europe/Berlin runs */30 through the fall-back night (2026-10-25, 03:00
    CEST -> 02:00 CET). The repeated hour's ticks (02:00 and 02:30 CET, 01:00 and 01:30 UTC) are
    ticks like any other: each must become its own job, keyed by its UTC instant."""
    start = datetime(2026, 10, 24, 23, 50, tzinfo=UTC)
    h = Harness(sched("*/30 * * * *", "Europe/Berlin"), now=start)
    h.scheduler.run_once()
    for minute in range(1, 200):
        h.at(start + timedelta(minutes=minute, seconds=1))
    expected = [
        tick_key(datetime(2026, 10, 24, 23, 30, tzinfo=UTC) + timedelta(minutes=30 * i)) for i in range(8)
    ]
    assert [j.key for j in h.jobs] == expected


def test_q4_dst_spring_forward_makes_one_job_for_the_skipped_tick() -> None:
    """Scenario: "30 2 * * *" in Europe/Berlin on 2026-03-29, when 02:30 does not exist (02:00 CET
    -> 03:00 CEST): one job at 03:00 CEST, none twice, and the next day's at 02:30 CEST as usual
    (the start-up makes up the day before's, at most one period old); a second engine started right
    after the skipped tick makes it up under the same key."""
    start = datetime(2026, 3, 28, 23, 0, tzinfo=UTC)
    h = Harness(sched("30 2 * * *", "Europe/Berlin"), now=start)
    h.scheduler.run_once()
    for minute in range(1, 26 * 60, 7):
        h.at(start + timedelta(minutes=minute))
    assert [j.key for j in h.jobs] == [
        tick_key(datetime(2026, 3, 28, 1, 30, tzinfo=UTC)),
        tick_key(datetime(2026, 3, 29, 1, 0, tzinfo=UTC)),
        tick_key(datetime(2026, 3, 30, 0, 30, tzinfo=UTC)),
    ]
    late = Harness(sched("30 2 * * *", "Europe/Berlin"), now=datetime(2026, 3, 29, 1, 5, tzinfo=UTC))
    late.scheduler.run_once()
    assert [j.key for j in late.jobs] == [h.jobs[1].key]


def test_q4_engines_with_skewed_clocks_and_a_restart_exactly_at_a_tick_make_one_job_per_tick() -> None:
    """Scenario: two engines whose clocks differ by 1.3 s (one ahead, one behind the tick) share a
    schedule of every 2 s; a third starts exactly at a tick instant. Each enqueues each tick as it
    sees it: the keys derive from the tick, not the clock, so one job per tick and none skipped.
    The one ahead decides: a tick older than the last one enqueued is never made up (Q4')."""
    shared = Harness(sched("*/2 * * * * *"), now=T0)
    skew = timedelta(milliseconds=1300)

    def scheduler(offset: timedelta) -> Scheduler:
        return Scheduler(
            [sched("*/2 * * * * *")],
            shared.enqueue_tick,
            lambda: shared.now + offset,
            lambda t, v: None,
            logging.getLogger("t"),
        )

    ahead, behind = scheduler(skew), scheduler(-skew)
    for tenth in range(0, 200):
        shared.now = T0 + timedelta(milliseconds=100 * tenth)
        ahead.run_once()
        behind.run_once()
        if tenth == 100:  # exactly at the 10 s tick: a fresh engine makes up that tick, already there
            fresh = scheduler(timedelta(0))
            fresh.run_once()
            assert fresh.schedules[0].next_tick == T0 + timedelta(seconds=12)
    keys = [j.key for j in shared.jobs]
    assert len(keys) == len(set(keys))
    # the one ahead saw up to T0+21.2 s and enqueued T0 first; the one behind, starting at T0-1.3 s,
    # would make up T0-2 s, older than the last tick enqueued: not made up
    assert keys == [tick_key(T0 + timedelta(seconds=s)) for s in range(0, 22, 2)]


def test_q4_a_tick_whose_job_retention_deleted_is_not_made_up_by_a_restart() -> None:
    """Q4': the last tick is remembered apart from the job, so a restart within the period makes
    the tick up only if it was never enqueued, whatever retention deleted since."""
    h = Harness(sched("*/30 * * * * *"), now=T0 + timedelta(seconds=5))
    h.scheduler.run_once()
    assert [j.key for j in h.jobs] == [tick_key(T0)]
    h.keys.clear()  # retention deleted the done job, freeing its idempotency key
    restarted = Scheduler(
        [sched("*/30 * * * * *")], h.enqueue_tick, lambda: h.now, lambda t, v: None, logging.getLogger("t")
    )
    h.now = T0 + timedelta(seconds=29)
    restarted.run_once()
    assert [j.key for j in h.jobs] == [tick_key(T0)]
    assert restarted.schedules[0].next_tick == T0 + timedelta(seconds=30)


def test_q4_engine_enqueues_ticks_through_the_repo_remembering_the_last(repo: FakeRepo) -> None:
    from prometheus_client import CollectorRegistry

    from brooq_py.engine.metrics import Metrics
    from brooq_py.engine.services.scheduler import tick_enqueuer

    woken: list[Job] = []
    enqueue_tick = tick_enqueuer(repo, Metrics(CollectorRegistry()), woken.append)
    assert enqueue_tick("t", T0, Job("t", None, idempotency_key=tick_key(T0))) is not None
    assert enqueue_tick("t", T0, Job("t", None, idempotency_key="other")) is None
    assert repo.ticks == {"t": T0} and len(repo.rows) == 1 and len(woken) == 1

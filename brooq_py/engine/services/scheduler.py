"""Scheduler: periodic jobs from cron expressions (SPEC Q4, Q4').

Every engine that declares a schedule enqueues its ticks, no leader elected: only
the transaction that moves the schedule's mark (its ``schedule_tick`` row) forward
to a tick enqueues it, so each tick yields exactly one job. Its idempotency key
(``tick_key``) stays for the engines of the previous release.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from brooq_py.engine.metrics import Metrics
from brooq_py.engine.services.ticker import Ticker
from brooq_py.queue import ConfigError, EnqueueResult, InvalidJob, Job
from brooq_py.queue.port import Repo

# The longest the scheduler sleeps at once (a wall-clock jump is noticed within it).
MAX_SLEEP = 60.0
# After a failed enqueue the schedule is tried again this soon.
RETRY_DELAY = 1.0
_TINY = timedelta(microseconds=1)


def tick_key(tick: datetime) -> str:
    """The idempotency key of the job for *tick*: its instant in UTC, so every engine derives the same."""
    return "cron:" + tick.astimezone(ZoneInfo("UTC")).isoformat()


@dataclass
class Schedule:
    """One periodic job: a topic, a cron expression read in *tz*, and the job's payload and priority."""

    topic: str
    cron: str
    payload: Any
    tz: ZoneInfo
    priority: int
    next_tick: datetime | None = field(default=None, compare=False)

    @classmethod
    def build(cls, topic: Any, cron: Any, payload: Any, timezone: Any, priority: Any) -> Schedule:
        """Validate everything now; raise ConfigError listing every problem."""
        problems: list[str] = []
        try:
            tz = ZoneInfo(timezone) if isinstance(timezone, str) and timezone else None
        except (ZoneInfoNotFoundError, ValueError):
            tz = None
        if tz is None:
            problems.append(f"timezone: unknown time zone {timezone!r}")
        if not isinstance(cron, str):
            problems.append(f"cron must be a str, got {type(cron).__name__}")
        elif len(cron.split()) not in (5, 6):
            problems.append(f"cron {cron!r}: expected 5 fields, or 6 with a leading seconds field")
        else:
            try:
                CronSim(cron, datetime.now(tz or ZoneInfo("UTC")))
            except CronSimError as exc:
                problems.append(f"cron {cron!r}: {exc}")
        try:
            job = Job(
                topic, payload, idempotency_key=tick_key(datetime.now(ZoneInfo("UTC"))), priority=priority
            )
            job.payload_json()
        except (InvalidJob, TypeError, ValueError) as exc:
            problems.append(str(exc))
        if problems or tz is None:
            raise ConfigError(problems)
        return cls(topic, cron, payload, tz, priority)

    def after(self, t: datetime) -> datetime:
        """The first tick strictly after *t*."""
        return next(CronSim(self.cron, t.astimezone(self.tz)))

    def latest(self, t: datetime) -> tuple[datetime, datetime]:
        """The last tick at or before *t*, and the one before it."""
        back = CronSim(self.cron, (t + _TINY).astimezone(self.tz), reverse=True)
        last = next(back)
        return last, next(back)

    def job(self, tick: datetime) -> Job:
        return Job(self.topic, self.payload, idempotency_key=tick_key(tick), priority=self.priority)


class Scheduler(Ticker):
    """Enqueues each schedule's due tick, then sleeps until the earliest next tick (at most MAX_SLEEP)."""

    name = "scheduler"

    def __init__(
        self,
        schedules: Sequence[Schedule],
        enqueue_tick: Callable[[str, datetime, Job], EnqueueResult | None],
        now: Callable[[], datetime],
        next_tick: Callable[[str, float], None],
        log: logging.Logger,
    ) -> None:
        super().__init__(MAX_SLEEP, log)
        self.schedules = list(schedules)
        self._enqueue_tick = enqueue_tick
        self._now = now
        self._next_tick = next_tick
        self._failed = False

    def tick(self) -> None:
        now = self._now()
        self._failed = False
        for s in self.schedules:
            if s.next_tick is not None and s.next_tick > now:
                continue
            due, before = s.latest(now)
            # at start-up the latest tick is made up only if at most one period old; older ones never are
            if s.next_tick is not None or now - due <= due - before:
                try:
                    result = self._enqueue_tick(s.topic, due, s.job(due))
                except Exception as exc:
                    self._failed = True
                    self.log.warning("scheduler: enqueueing %s tick %s failed: %s", s.topic, due, exc)
                    continue
                if result is None:
                    self.log.debug("scheduler: %s tick %s was enqueued already", s.topic, due)
                elif result.created:
                    self.log.debug("scheduler: enqueued %s tick %s as %s", s.topic, due, result.id)
            s.next_tick = s.after(now)
            self._next_tick(s.topic, s.next_tick.timestamp())

    def next_delay(self) -> float:
        if self._failed:
            return RETRY_DELAY
        ticks = [s.next_tick for s in self.schedules if s.next_tick is not None]
        if len(ticks) < len(self.schedules):
            return 0.0
        if not ticks:
            return MAX_SLEEP
        wait = (min(ticks) - self._now()).total_seconds()
        return min(MAX_SLEEP, max(0.0, wait) + 0.001)


def tick_enqueuer(
    repo: Repo, metrics: Metrics, enqueued: Callable[[Job], None]
) -> Callable[[str, datetime, Job], EnqueueResult | None]:
    """The scheduler's enqueue, counted and waking the engine as ``Engine.enqueue`` does."""

    def enqueue_tick(schedule: str, tick: datetime, job: Job) -> EnqueueResult | None:
        result = repo.enqueue_tick(schedule, tick, job)
        if result is not None and result.created:
            metrics.child(metrics.enqueued, job.topic).inc()
            enqueued(job)
        return result

    return enqueue_tick

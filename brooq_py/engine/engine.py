"""Engine: the facade that wires the worker pool and the background services together."""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import uuid
from collections import Counter
from collections.abc import Sequence
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any

from prometheus_client import CollectorRegistry

from brooq_py.engine.attempt import Attempt, Kind
from brooq_py.engine.capacity import Capacity
from brooq_py.engine.clock import Clock, SystemClock
from brooq_py.engine.completer import Completer
from brooq_py.engine.config import Config
from brooq_py.engine.dispatcher import Dispatcher
from brooq_py.engine.health import Health
from brooq_py.engine.heartbeat import Heartbeat
from brooq_py.engine.inflight import InFlight
from brooq_py.engine.metrics import Metrics, StoreCollector
from brooq_py.engine.reaper import Reaper
from brooq_py.engine.repo import ClaimedJob, Outcome, Repo
from brooq_py.engine.retention import Retention
from brooq_py.engine.runner import Runner
from brooq_py.engine.scheduler import Schedule, Scheduler
from brooq_py.engine.slots import AsyncRunner, SlotPool
from brooq_py.engine.supervisor import Supervisor
from brooq_py.engine.ticker import Ticker
from brooq_py.engine.topic_watch import TopicWatch
from brooq_py.engine.wakeups import stage_now, wake_services
from brooq_py.engine.watchdog import Watchdog
from brooq_py.queue import (
    BrooqError,
    ConfigError,
    Context,
    EngineStopping,
    EnqueueResult,
    Job,
    JobRow,
    KindOptions,
    Tx,
)
from brooq_py.queue.handler import Handler

# How long the completer lets outcomes gather before it writes them (SPEC C10: "within milliseconds").
COMPLETER_LINGER = 0.002


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Engine:
    """Claims, runs and settles jobs of the registered topics through *repo*.

    ``start()`` starts the pool and the services; ``stop(timeout)`` stops
    claiming, lets in-flight work finish up to *timeout* (default: the lease),
    then cancels it with ``EngineStopping`` and flushes every outcome (SPEC C11).
    """

    def __init__(
        self,
        repo: Repo,
        config: Config | None = None,
        *,
        logger: logging.Logger | None = None,
        registry: CollectorRegistry | None = None,
        clock: Clock | None = None,
        worker_id: str | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.repo = repo
        self.config = config if config is not None else Config()
        if not isinstance(self.config, Config):
            raise ConfigError(f"config must be a Config, got {type(self.config).__name__}")
        self.log = logger or logging.getLogger("brooq_py.engine")
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.clock: Clock = clock or SystemClock()
        self.worker_id = worker_id or default_worker_id()
        self.metrics = Metrics(self.registry)
        self.registry.register(StoreCollector(self.repo.gauges, lambda: self.topics, self.log))
        self._kinds: dict[str, Kind] = {}
        self._lock = threading.RLock()
        self._state = "new"  # new -> running -> stopping -> stopped
        self.inflight = InFlight()
        self._async = AsyncRunner(self.log)
        self.runner = Runner(repo, self.inflight, self.metrics, self._async, self.log, rng)
        self.supervisor = Supervisor(
            self.inflight,
            self.runner,
            self.metrics,
            self.config.effective_watchdog_grace.total_seconds(),
            lambda: self._state == "stopping",
            self.log,
        )
        self._slots: SlotPool | None = None
        self._dispatcher: Dispatcher | None = None
        self._completer: Completer | None = None
        self._services: list[Ticker] = []
        # operator controls (SPEC Q2-Q4): per-topic capacity, the settings watch, periodic jobs
        self._caps: dict[str, int | None] = {}
        self.capacity = Capacity(
            self._caps, self.config.td("poll_interval").total_seconds(), self.clock.monotonic
        )
        self._topic_watch = TopicWatch(
            self.config.td("poll_interval").total_seconds(),
            self.repo.topic_settings,
            lambda: self.topics,
            self.capacity,
            self.metrics.topic_setting,
            self.log,
        )
        self._schedules: list[Schedule] = []

    # --- registration ------------------------------------------------------

    @property
    def topics(self) -> tuple[str, ...]:
        return tuple(self._kinds)

    @property
    def running(self) -> bool:
        return self._state == "running"

    def register_kind(self, topic: str, handler: Handler, options: KindOptions | None = None) -> None:
        """Register *handler* for *topic*; before ``start()`` only.

        Raise ``ConfigError`` for invalid options, a bad topic or handler, or a
        topic registered twice; ``BrooqError`` after ``start()``.
        """
        with self._lock:
            if self._state != "new":
                raise BrooqError("register_kind() must be called before start()")
            problems: list[str] = []
            if not isinstance(topic, str) or not topic or "\x00" in topic:
                problems.append(f"topic must be non-empty text without NUL, got {topic!r}")
            elif topic in self._kinds:
                problems.append(f"topic {topic!r} is already registered")
            if options is None:
                options = self.config.kind_defaults()
            elif not isinstance(options, KindOptions):
                problems.append(f"options must be a KindOptions, got {type(options).__name__}")
            kind: Kind | None = None
            if not problems:
                try:
                    kind = Kind.build(topic, handler, options)
                except TypeError as exc:
                    problems.append(str(exc))
            if problems or kind is None:
                raise ConfigError(problems)
            self._kinds[topic] = kind
            self._caps[topic] = kind.options.concurrency
            self.metrics.prime([topic])

    def schedule(
        self, topic: str, cron: str, payload: Any = None, *, timezone: str = "UTC", priority: int = 0
    ) -> None:
        """Enqueue a job of *topic* at every tick of *cron* (in *timezone*); before ``start()`` only.

        Every engine that declares it enqueues it, and each tick yields exactly one
        job (SPEC Q4). Raise ``ConfigError`` at once for a bad expression, time
        zone, topic, payload or priority, or a topic scheduled twice.
        """
        with self._lock:
            if self._state != "new":
                raise BrooqError("schedule() must be called before start()")
            s = Schedule.build(topic, cron, payload, timezone, priority)
            if any(x.topic == topic for x in self._schedules):
                raise ConfigError([f"topic {topic!r} is already scheduled (one schedule per topic)"])
            self._schedules.append(s)

    # --- producer side -----------------------------------------------------

    def enqueue(self, job: Job) -> EnqueueResult:
        """Enqueue *job* through the pool (see ``Store.enqueue``)."""
        result = self.repo.enqueue(job)
        if result.created:
            self.metrics.child(self.metrics.enqueued, job.topic).inc()
        return result

    def enqueue_tx(self, tx: Tx, job: Job) -> EnqueueResult:
        """Enqueue *job* inside the caller's transaction *tx* (SPEC E3)."""
        result = self.repo.enqueue_tx(tx, job)
        if result.created:
            self.metrics.child(self.metrics.enqueued, job.topic).inc()
        return result

    def enqueue_many(self, jobs: Sequence[Job], tx: Tx | None = None) -> list[EnqueueResult]:
        """Enqueue a batch in one round trip (SPEC E5)."""
        results = self.repo.enqueue_many(jobs, tx)
        for job, r in zip(jobs, results, strict=True):
            if r.created:
                self.metrics.child(self.metrics.enqueued, job.topic).inc()
        return results

    def begin(self) -> AbstractContextManager[Tx]:
        """A transaction from the pool: commit on a clean exit, rollback on an exception."""
        return self.repo.begin()

    def cancel(self, job_id: str) -> bool:
        """Cancel a pending, scheduled, failed or processing job (SPEC X1); a running one stops via lease loss."""
        return self.repo.cancel(job_id)

    def get(self, job_id: str) -> JobRow | None:
        """The job's row, or None for an unknown or malformed id."""
        return self.repo.get(job_id)

    def health(self) -> Health:
        database = False
        try:
            database = bool(self.repo.ping())
        except Exception:
            database = False
        return Health.of(
            database=database,
            running=self.running,
            hung=self.inflight.hung_count(),
            workers=self.config.workers,
        )

    # --- lifecycle ---------------------------------------------------------

    def start(self) -> None:
        """Start the worker pool and the background services; idempotent."""
        with self._lock:
            if self._state == "running":
                return
            if self._state != "new":
                raise BrooqError("an engine cannot be started again after stop()")
            if not self._kinds:
                self.log.warning("engine: starting with no registered topic; nothing will be claimed")
            cfg = self.config
            self._slots = SlotPool(cfg.workers, self._run_claimed, self.log)
            self.supervisor.slots = self._slots
            self._completer = Completer(
                self.repo.settle_many,
                self._written,
                self.log,
                max_buffer=max(1000, 8 * cfg.workers),
                linger=COMPLETER_LINGER,
            )
            self.runner.completer = self._completer
            self._dispatcher = Dispatcher(
                self._claim, self._slots, self._launch, cfg.td("poll_interval").total_seconds(), self.log
            )
            self._services = [
                Heartbeat(
                    cfg.heartbeat_period,
                    self.inflight.held,
                    lambda leases: self.repo.renew(leases, cfg.lease_td),
                    self.supervisor.lease_lost,
                    self.log,
                ),
                Watchdog(
                    self.inflight.running,
                    cfg.effective_watchdog_grace.total_seconds(),
                    self.clock,
                    self.supervisor.give_up,
                    self.supervisor.hung,
                    self.log,
                ),
                Reaper(
                    cfg.effective_reaper_period,
                    self.repo.reap_expired,
                    lambda t: self.metrics.child(self.metrics.reaped, t).inc(),
                    self.log,
                ),
                self._topic_watch,
            ]
            self._services += wake_services(self.repo, cfg, self.topics, self._dispatcher.wake, self.log)
            self.capacity.wake = self._dispatcher.wake
            if self._schedules:
                self._services.append(
                    Scheduler(
                        self._schedules,
                        self.enqueue,
                        self.clock.now,
                        lambda t, at: self.metrics.child(self.metrics.schedule_next, t).set(at),
                        self.log,
                    )
                )
            if cfg.retention_enabled:
                self._services.append(
                    Retention(
                        cfg.effective_retention_period,
                        cfg.td("retention_ttl"),
                        cfg.retention_batch,
                        self.repo.delete_terminal,
                        lambda t, n: self.metrics.child(self.metrics.retention_deleted, t).inc(n),
                        self.log,
                    )
                )
            self._completer.start()
            self._slots.start()
            for s in self._services:
                s.start()
            self._dispatcher.start()
            self._state = "running"
            self.log.info(
                "engine: started worker=%s workers=%d topics=%s lease=%gs",
                self.worker_id,
                cfg.workers,
                ",".join(self._kinds) or "-",
                cfg.lease_td.total_seconds(),
            )

    def stop(self, timeout: float | None = None) -> None:
        """Stop gracefully (SPEC C11); safe before start() and twice.

        Stop claiming; wait up to *timeout* seconds (None: the lease) for
        in-flight handlers; cancel the rest with ``EngineStopping`` and wait up
        to watchdog_grace for them (one still running is hung and its row goes
        back to pending, attempt given back); flush every outcome.
        """
        with self._lock:
            if self._state != "running":
                return
            self._state = "stopping"
        cfg = self.config
        wait = cfg.lease_td.total_seconds() if timeout is None else max(0.0, float(timeout))
        slots, dispatcher, completer = self._slots, self._dispatcher, self._completer
        assert slots is not None and dispatcher is not None and completer is not None
        dispatcher.stop()
        if not slots.wait_idle(wait):
            for a in self.inflight.running():
                if not a.finished:
                    a.ctx.cancel(EngineStopping("the engine is stopping"))
            slots.wait_idle(cfg.effective_watchdog_grace.total_seconds() + 1.0)
        for a in self.inflight.running():
            if a.hung and not a.stopping_hung:
                # hung before stop: its lease was let go; hand the row back now rather than
                # leave it processing until the reaper (guarded: a no-op if it moved on)
                self.supervisor.hand_back(a)
        left = completer.stop()
        self.runner.completer = None  # from now on (run_once) outcomes are written at once
        for s in reversed(self._services):
            s.stop()
        slots.stop()
        self._async.close()
        self._state = "stopped"
        if left:
            self.log.error("engine: stopped with %d outcomes unwritten (database unreachable)", left)
        self.log.info("engine: stopped worker=%s", self.worker_id)

    def close(self) -> None:
        """Stop if needed and close the store's own connections; safe to repeat."""
        self.stop()
        with self._lock:
            if self._state == "closed":
                return
            self._state = "closed"
        self.repo.close()

    def __enter__(self) -> Engine:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def run_once(self) -> int:
        """Without start(): claim one batch, run it in this thread, write every outcome; return how many.

        Timeouts and the heartbeat do not run here: it is meant for tests and scripts.
        """
        with self._lock:
            if self._state == "running":
                raise BrooqError("run_once() is for an engine that was not started")
        stage_now(self.repo, self.config, self.topics)
        self._topic_watch.run_once()
        rows = self._claim(self.config.workers)
        for row in rows:
            self._run_claimed(row)
        return len(rows)

    # --- internals -----------------------------------------------------------

    def _claim(self, limit: int) -> list[ClaimedJob]:
        if not self._kinds:
            return []
        rows = self.capacity.claim(self.repo, list(self._kinds), limit, self.worker_id, self.config.lease_td)
        for topic, n in Counter(r.topic for r in rows).items():  # one counter update per topic a claim
            self.metrics.child(self.metrics.claimed, topic).inc(n)
        return rows

    def _attempt(self, row: ClaimedJob) -> Attempt | None:
        kind = self._kinds.get(row.topic)
        if kind is None:  # cannot happen: claims name only our topics; hand it back all the same
            self.log.error("engine: claimed job id=%s of unregistered topic %r", row.id, row.topic)
            return None
        ctx = Context(deadline=self.clock.now() + kind.options.td("attempt_timeout"))
        a = Attempt(row, kind, self.clock.monotonic(), ctx)
        clock = self.clock

        def mark(_cause: BaseException) -> None:
            a.cancelled_at = clock.monotonic()

        ctx.add_callback(mark)
        return a

    def _written(self, batch: Sequence[Outcome], written: set[str]) -> None:
        self.runner.on_written(batch, written)
        self.capacity.settled(o.topic for o in batch)  # a limited topic may have room again (SPEC Q3)

    def _launch(self, row: ClaimedJob) -> None:
        # The slot thread builds the attempt: the dispatcher only hands rows out, so it is
        # back to claiming at once (its work is serial; the slots' is parallel).
        assert self._slots is not None
        self._slots.submit(row)

    def _run_claimed(self, row: ClaimedJob) -> Attempt | None:
        try:
            a = self._attempt(row)
            if a is None:
                return None
            self.inflight.add(a)
            self.runner.run(a)
            return a
        finally:
            self.capacity.ended(row.topic)

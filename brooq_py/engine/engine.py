"""Engine: the facade wiring the worker pool and services (SPEC C11, C11'', F0, K4, N1, Q3, Q4, X2', Z2)."""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import timedelta
from types import TracebackType
from typing import Any

from prometheus_client import CollectorRegistry

from brooq_py.engine.attempt.attempt import Attempt, Hooks, Kind
from brooq_py.engine.attempt.handover import Handover, Supervisor
from brooq_py.engine.attempt.inflight import InFlight
from brooq_py.engine.attempt.intake import Capacity, Intake
from brooq_py.engine.attempt.outcome import Phase
from brooq_py.engine.attempt.runner import AsyncRunner, Runner, SlotPool
from brooq_py.engine.clock import Clock, SystemClock
from brooq_py.engine.config import Config
from brooq_py.engine.health import Health, StatementTracker, tracked
from brooq_py.engine.metrics import EngineRegistry, Metrics, RefusalCollector, SnapshotCollector
from brooq_py.engine.producing import Producing
from brooq_py.engine.schema import check_schema
from brooq_py.engine.services.cleanup import Reaper, Retention, reap
from brooq_py.engine.services.completer import Completer
from brooq_py.engine.services.dispatcher import Dispatcher
from brooq_py.engine.services.events import EventBus
from brooq_py.engine.services.liveness import Fence, Heartbeat, Watchdog
from brooq_py.engine.services.refresher import Refresher
from brooq_py.engine.services.scheduler import Schedule, Scheduler, tick_enqueuer
from brooq_py.engine.services.ticker import Ticker, stop_services
from brooq_py.engine.services.wakeups import Stager, TopicWatch, WakeListener, stage_now
from brooq_py.queue import BrooqError, ConfigError, EngineStopping, Event, Job, KindOptions, LeaseLost
from brooq_py.queue.handler import Handler
from brooq_py.queue.port import EngineProof, Facade, Listener, Repo, Staged
from brooq_py.tasks import Tasks

# How long the completer lets outcomes gather before it writes them (SPEC C10: "within milliseconds").
COMPLETER_LINGER = 0.002
# How long a stop may take past its timeout and the watchdog's grace, whatever the database does.
STOP_AFTER = 4.0


class Engine(Producing):
    """Claims, runs and settles jobs of the registered topics through *repo*, from ``start()`` to
    ``stop()``."""

    def __init__(
        self,
        repo: Repo | Facade,
        config: Config | None = None,
        *,
        logger: logging.Logger | None = None,
        registry: CollectorRegistry | None = None,
        clock: Clock | None = None,
        worker_id: str | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.store = repo  # as given: closed by close(); the operator's surface serves it
        self.config = config if config is not None else Config()
        if not isinstance(self.config, Config):
            raise ConfigError(f"config must be a Config, got {type(self.config).__name__}")
        self.log = logger or logging.getLogger("brooq_py.engine")
        self.registry = registry if registry is not None else EngineRegistry(auto_describe=True)
        self.clock: Clock = clock or SystemClock()
        # Every statement's outcome feeds health(), so /healthz runs none of its own.
        self.statements = StatementTracker(self.clock)
        worker = repo.worker if isinstance(repo, Facade) else repo  # a Store's engine side (River's driver)
        self.repo = repo = tracked(worker, self.statements)
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.instance = str(uuid.uuid4())  # this engine, should another be given the same worker id
        self.metrics = Metrics(self.registry)
        self.refresher = Refresher(
            self.config.td("gauges_period"),
            repo.gauges,
            repo.database_gauges,
            lambda: self.topics,
            self.clock,
            self.log,
        )
        self.registry.register(SnapshotCollector(self.refresher.view))
        self.registry.register(RefusalCollector.of(self.store))
        self._kinds: dict[str, Kind] = {}
        self._lock = threading.RLock()
        self._state = "new"  # new -> running -> stopping -> stopped
        self.inflight = InFlight(lambda topic: self.capacity.ended(topic), self.clock.monotonic)
        self._async = AsyncRunner(self.log)
        self.hooks = Hooks(self.log, self.metrics, rng)
        self.hooks.stopping = lambda: self._state == "stopping"
        self.hooks.left_running = self.inflight.end
        self.hooks.let_go = self.inflight.drop
        self.hooks.drop_claim = lambda a: self.inflight.drop_claim(a.row.claim_token, a.id)
        self.handover = Handover(repo, self.inflight, self.metrics, self.log)
        self.handover.passes_dead = self._passes_dead
        self.runner = Runner(self.handover, self.metrics, self._async, self.log)
        self.runner.result_max_bytes = self.config.result_max_bytes
        self.supervisor = Supervisor(
            self.inflight,
            self.handover,
            self.config.effective_watchdog_grace.total_seconds(),
            (self.config.lease_td - self.config.margin_td).total_seconds(),
        )
        self._slots: SlotPool | None = None
        self._dispatcher: Dispatcher | None = None
        self._enqueued: Callable[[Job], None] = lambda job: None  # poll-only: wake our own services
        self._may_claim: Callable[[], bool] = lambda: True  # the fence's verdict, from start()
        self._completer: Completer | None = None
        self._services: list[Ticker] = []
        self._stopped = threading.Event()  # set once a stop() is over: a concurrent one waits for it
        self._caps: dict[str, int | None] = {}
        self.capacity = Capacity(
            self._caps, self.config.td("poll_interval").total_seconds(), self.clock.monotonic
        )
        self.handover.on_settled = self.capacity.settled  # a limited topic may have room again
        self.capacity.on_received = lambda rows: self.inflight.receive(r.claim_token for r in rows)
        self.capacity.on_rate_held = lambda topic: self.metrics.child(self.metrics.rate_held, topic).inc()
        self._topic_watch = TopicWatch(
            self.config.td("poll_interval").total_seconds(),
            self.repo.topic_settings,
            lambda: self.topics,
            self.capacity,
            self.metrics.topic_setting,
            self.log,
        )
        self._schedules: list[Schedule] = []
        self.events = EventBus(
            self.log,
            on_dropped=self.metrics.events_dropped.inc,
            on_listener_error=self.metrics.event_listener_errors.inc,
        )
        self.handover.events = self.events
        self.intake = Intake(
            repo,
            self.config,
            self._kinds,
            self.capacity,
            self.inflight,
            self.runner,
            self.handover,
            self.hooks,
            self.metrics,
            self.clock,
            self.worker_id,
            self.log,
            self.supervisor,
        )

    # --- registration ------------------------------------------------------

    @property
    def topics(self) -> tuple[str, ...]:
        return tuple(self._kinds)

    @property
    def running(self) -> bool:
        return self._state == "running"

    def _passes_dead(self, topic: str) -> bool:
        kind = self._kinds.get(topic)
        return kind is not None and kind.options.sequence_on_dead == "continue"

    def register_kind(self, topic: str, handler: Handler, options: KindOptions | None = None) -> None:
        """Register *handler* for *topic*, before ``start()`` (``BrooqError`` after). Raise ``ConfigError``
        for invalid options, a bad topic or handler, or a topic registered twice."""
        self._register(topic, handler, options, batch=False)

    def register_batch(self, topic: str, handler: Any, options: KindOptions | None = None) -> None:
        """Register *handler* for *topic* as a batch handler (SPEC BD1): ``handler(ctx, claims)`` gets
        up to ``options.batch_size`` claims of the topic at once (the engine's ``workers`` when None;
        each claim takes a slot), waiting at most ``options.batch_wait`` for a fuller batch, and
        returns one result or exception per claim, in claim order. As ``register_kind`` otherwise."""
        self._register(topic, handler, options, batch=True)

    def _register(self, topic: str, handler: Any, options: KindOptions | None, *, batch: bool) -> None:
        with self._lock:
            if self._state != "new":
                raise BrooqError(
                    f"{'register_batch' if batch else 'register_kind'}() must be called before start()"
                )
            problems: list[str] = []
            if not isinstance(topic, str) or not topic or "\x00" in topic:
                problems.append(f"topic must be non-empty text without NUL, got {topic!r}")
            elif topic in self._kinds:
                problems.append(f"topic {topic!r} is already registered")
            if options is None:
                options = self.config.kind_defaults()
            elif not isinstance(options, KindOptions):
                problems.append(f"options must be a KindOptions, got {type(options).__name__}")
            elif options.batch_size is not None and not batch:
                problems.append(
                    "batch_size is for Engine.register_batch (a handler of one claim has no batch)"
                )
            if batch and isinstance(options, KindOptions) and options.batch_size is None:
                options = dataclasses.replace(options, batch_size=self.config.workers)
            kind: Kind | None = None
            if not problems:
                try:
                    kind = Kind.build(topic, handler, options, batch=batch)
                except TypeError as exc:
                    problems.append(str(exc))
            if problems or kind is None:
                raise ConfigError(problems)
            self._kinds[topic] = kind
            self._caps[topic] = kind.options.concurrency
            self.metrics.prime([topic])

    def register_tasks(self, tasks: Tasks) -> None:
        """Register each task of *tasks* as a kind, before ``start()`` (see ``Tasks.register``): all of
        them or, on a ``ConfigError`` naming the task, none."""
        with self._lock:
            kinds, caps = dict(self._kinds), dict(self._caps)
            try:
                tasks.register(
                    self.register_kind, self.config.kind_defaults(), register_batch=self.register_batch
                )
            except BaseException:
                self._kinds.clear()
                self._kinds.update(kinds)
                self._caps.clear()
                self._caps.update(caps)
                raise

    def on_event(self, fn: Callable[[Event], None]) -> None:
        """Call *fn* once per event after its commit (before ``start()``; see docs/events.md)."""
        with self._lock:
            if self._state != "new":
                raise BrooqError("on_event() must be called before start()")
            self.events.add(fn)

    def schedule(
        self, topic: str, cron: str, payload: Any = None, *, timezone: str = "UTC", priority: int = 0
    ) -> None:
        """Enqueue a job of *topic* at every tick of *cron* (in *timezone*), exactly one a tick across
        engines; before ``start()`` only. Raise ``ConfigError`` at once for a bad expression, time
        zone, topic, payload or priority, or a topic scheduled twice."""
        with self._lock:
            if self._state != "new":
                raise BrooqError("schedule() must be called before start()")
            s = Schedule.build(topic, cron, payload, timezone, priority)
            if any(x.topic == topic for x in self._schedules):
                raise ConfigError([f"topic {topic!r} is already scheduled (one schedule per topic)"])
            self._schedules.append(s)

    def health(self) -> Health:
        """The engine's state and its statements' record, from memory: no database round trip."""
        cfg = self.config
        status = self.statements.status(cfg.health_grace.total_seconds(), cfg.lease_td.total_seconds())
        return Health.of(
            database=status.ok,
            running=self.running,
            hung=self.inflight.hung_count(),
            workers=cfg.workers,
            last_success_age=status.last_success_age,
            failing_for=status.failing_for,
            error=status.error,
        )

    # --- lifecycle ---------------------------------------------------------

    def start(self) -> None:
        """Start the worker pool and the background services; idempotent. Raise ``BrooqError`` when
        the database answers and the schema is not migrated (an unreachable one does not stop it)."""
        with self._lock:
            if self._state == "running":
                return
            if self._state != "new":
                raise BrooqError("an engine cannot be started again after stop()")
            if not self._kinds:
                self.log.warning("engine: starting with no registered topic; nothing will be claimed")
            cfg = self.config
            check_schema(self.repo, self.log)
            bound = getattr(self.repo, "bound_waits", None)
            if callable(bound):
                bound(cfg.lease_td)
            slots = self._slots = self.intake.slots = SlotPool(cfg.workers)
            self.hooks.release_slot = slots.release
            self._completer = Completer(
                self.repo.settle_many,
                self.handover.on_written,
                self.log,
                max_buffer=max(1000, 8 * cfg.workers),
                linger=COMPLETER_LINGER,
            )
            self.handover.completer = self._completer
            self._dispatcher = Dispatcher(
                lambda n: self.intake.claim(n) if self._may_claim() else [],
                slots,
                self.intake.launch_all,
                cfg.td("poll_interval").total_seconds(),
                self.log,
                hand_back=self.intake.hand_back,
                batch=cfg.claim_batch,
                next_due=self._next_claim_due,
                owed=self._owed_topics,
                claim_only=lambda n, only: self.intake.claim(n, only) if self._may_claim() else [],
            )
            self._services = self._background(self._dispatcher.wake)
            self.events.start()
            self._completer.start()
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

    def _next_claim_due(self) -> float | None:
        """Seconds until the dispatcher claims without a wake-up: a rate-limited topic's next token,
        or a wider read that the claim heads owe (a Repo of brooq_py's, SPEC B1), if sooner than a poll."""
        owed_in = getattr(self.repo, "owed_in", None)
        dues = [self.capacity.next_due_in(), owed_in(self.topics) if owed_in is not None else None]
        return min((d for d in dues if d is not None), default=None)

    def _owed_topics(self) -> list[str]:
        """The topics whose owed read fell due, taken: the dispatcher claims them alone."""
        take_owed = getattr(self.repo, "take_owed", None)
        return take_owed(self.topics) if take_owed is not None else []

    def _background(self, wake: Callable[[], None]) -> list[Ticker]:
        """The background services in the order they start (they stop in the reverse)."""
        cfg, repo, metrics, log = self.config, self.repo, self.metrics, self.log
        fence = Fence(self.supervisor.fence_after, self.clock, self.supervisor.fence)
        fence.on_proven = wake
        self._may_claim = fence.may_claim  # not before a heartbeat proved the engine
        self.intake.proof = lambda: fence.proven_at  # each claim's attempts hold the proof it was made under
        clock = self.clock
        self.runner.before_start = lambda a: fence.check([a], clock.monotonic())  # F0 at the start too
        proof = EngineProof(
            self.worker_id, socket.gethostname(), os.getpid(), cfg.lease_td, cfg.margin_td, self.instance
        )
        heartbeat = Heartbeat(
            cfg.heartbeat_period.total_seconds(),
            proof,
            self.inflight,
            repo.beat,
            fence,
            self.supervisor,
            log,
            self.clock,
            write_progress=repo.write_progress,
        )
        self.inflight.on_unheld_end = heartbeat.wake  # a canceled handler ended: say so now
        self.capacity.wake = wake

        continuing = [t for t in self.topics if self._passes_dead(t)]

        def stage(topics: Sequence[str], batch: int) -> Staged:
            if continuing:  # SPEC Q5: a pass after a dead outcome that never ran is made here
                try:
                    repo.pass_dead((), continuing)
                except Exception as exc:
                    log.debug("stager: letting sequences pass dead members failed (%s)", exc)
            staged = repo.stage(topics, batch, cfg.notify)
            if not cfg.notify:  # no NOTIFY announces what it made ready: this engine's stager does
                self.capacity.notified([t for t, n in staged.promoted.items() if n])
            return staged

        stager = Stager(
            cfg.td("poll_interval").total_seconds(),
            self.topics,
            stage,
            repo.next_due,
            wake,
            log,
        )
        self.handover.on_waiting = stager.wake  # a retry time written: the trigger announces inserts only
        services: list[Ticker] = [
            heartbeat,
            Watchdog(self.inflight, self.supervisor, fence, self.clock, log),
            Reaper(
                cfg.effective_reaper_period,
                functools.partial(reap, repo, self.events),
                lambda topic: metrics.child(metrics.reaped, topic).inc(),
                log,
            ),
            self.refresher,
            self._topic_watch,
            stager,
        ]
        if cfg.notify:

            def listen() -> Listener:
                sub = repo.listen(self.topics, stager.wake, self.intake.on_cancel)
                # NOTIFYs sent while no LISTEN was up are lost (a cancel among them): look again
                stager.wake()
                heartbeat.wake()
                return sub

            services.append(WakeListener(listen, wake, log, self.capacity.notified))
        else:
            ours = frozenset(self.topics)

            def enqueued(job: Job) -> None:  # no NOTIFY: the engine wakes itself for its own jobs
                if job.topic in ours:
                    if job.available_at is not None:
                        stager.wake()
                    self.capacity.notified((job.topic,))
                    wake()

            self._enqueued = enqueued
        if self._schedules:
            services.append(
                Scheduler(
                    self._schedules,
                    tick_enqueuer(repo, metrics, self._enqueued),
                    self.clock.now,
                    lambda topic, at: metrics.child(metrics.schedule_next, topic).set(at),
                    log,
                )
            )
        if cfg.retention_enabled:
            services.append(
                Retention(
                    cfg.effective_retention_period,
                    cfg.td("retention_ttl"),
                    cfg.retention_batch,
                    repo.delete_terminal,
                    lambda topic, n: metrics.child(metrics.retention_deleted, topic).inc(n),
                    log,
                    history=cfg.effective_history_after,
                    move=repo.move_terminal,
                    drop=repo.drop_history,  # at the ttl, whether or not the mover still runs
                )
            )
        return services

    def stop(self, timeout: float | timedelta | None = None) -> None:
        """Stop gracefully, safe before start() and twice: stop claiming, wait up to *timeout* seconds
        (None: the lease) for in-flight handlers, cancel the rest with ``EngineStopping`` and wait up to
        watchdog_grace (one still running is hung, its row handed back), flush every outcome. A call
        during another stop returns once that one is over; one from a handler or an event listener
        only starts the stop. ``math.inf``: wait as long as the handlers run; TypeError for a timeout
        that is no number (nothing stopped)."""
        timeout = _stop_wait(timeout)
        if self._defer(lambda: self.stop(timeout)):
            return
        with self._lock:
            state = self._state
            if state == "running":
                self._state = "stopping"
        if state == "stopping":
            self._stopped.wait()
        if state != "running":
            return
        try:
            self._stop(timeout)
        finally:  # whatever raised in it: the engine is stopped, a later or waiting stop() returns
            self._state = "stopped"
            self._stopped.set()

    def _stop(self, timeout: float | None) -> None:
        """``stop``'s work, once the engine is "stopping"."""
        cfg = self.config
        wait = cfg.lease_td.total_seconds() if timeout is None else timeout
        grace = cfg.effective_watchdog_grace.total_seconds()
        # Whatever the database does: what still waits on it after this is left to daemon threads.
        deadline = time.monotonic() + wait + grace + STOP_AFTER
        slots, dispatcher, completer = self._slots, self._dispatcher, self._completer
        assert slots is not None and dispatcher is not None and completer is not None
        dispatcher.stop(timeout=1.0)  # a claim stuck on a silent socket hands its rows back later
        self.inflight.close()  # and so does a take-in stalled past that wait: held is the stop's to end
        self.runner.batcher.stop()  # batches still gathering claims (batch_wait) start now
        if not slots.wait_idle(wait):
            for a in self.inflight.running():
                self.supervisor.stopping_cancel(a)
            slots.wait_idle(grace)
        for a in self.inflight.running():
            if a.hung and a.ending is Phase.HUNG and not isinstance(a.ctx.cause, EngineStopping):
                # hung before the stop, its lease let go: hand the row back now, not at the reaper
                self.supervisor.release_at_stop(a)
            else:  # still running after the stop's grace: hung at stop
                self.supervisor.declare_hung(a)
        left = [0]  # outcomes left unwritten by the flush, on a thread joined until the deadline

        def finish() -> None:
            slots.wait_idle(max(0.0, min(cfg.lease_td.total_seconds(), deadline - time.monotonic() - 1.0)))
            left[0] = completer.stop(
                max(0.1, min(cfg.lease_td.total_seconds(), deadline - time.monotonic() - 0.5))
            )
            try:  # what is still ours is the reaper's from now on
                self.repo.leave(self.worker_id, self.instance)
            except Exception as exc:  # an unreachable store: the engine's row goes stale instead
                self.log.warning("engine: could not remove its row at stop (%s)", exc)

        finisher = threading.Thread(target=finish, name="brooq-stop-flush", daemon=True)
        finisher.start()
        finisher.join(max(0.0, deadline - time.monotonic() - 0.3))
        if finisher.is_alive():
            left[0] = max(1, completer.pending)
            self.log.error("engine: the database did not answer the stop's last writes in time")
        self.handover.completer = None  # from now on (run_once) outcomes are written at once
        stop_services(self._services, max(0.0, deadline - time.monotonic() - 0.2))
        self.runner.threads.stop()
        self.runner.settlers.stop()
        self._async.close()
        self.events.stop(max(0.1, deadline - time.monotonic()))  # after the last flush
        if left[0]:
            self.log.error("engine: stopped with %d outcomes unwritten (database unreachable)", left[0])
        self.log.info("engine: stopped worker=%s", self.worker_id)

    def close(self) -> None:
        """Stop if needed and close the store's own connections; safe to repeat."""
        if self._defer(self.close):
            return
        self.stop()
        self._async.close()  # run_once() may have started the loop without start()
        self.events.stop()  # and the events' thread: what is queued is delivered first
        with self._lock:
            if self._state == "closed":
                return
            self._state = "closed"
        self.store.close()

    def __enter__(self) -> Engine:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def run_once(self) -> int:
        """Without start(): claim one batch (up to workers and claim_batch), run it in this thread,
        write every outcome; return how many. No timeouts, heartbeat nor cancel heard (a job canceled
        while an earlier handler of the batch ran still runs, its outcome not written): for tests and
        scripts."""
        with self._lock:
            if self._state in ("running", "stopping"):  # a stop's claims are its own to end
                raise BrooqError(f"run_once() is for an engine that was not started (it is {self._state})")
        self.events.start()  # its events are delivered as a started engine's are; close() ends it
        # No heartbeat here: a claim's proof is its own send time, its row's lease ends a lease after
        # it (locked_until). A handler run after others of the batch, once lease - margin is past,
        # may find its job reaped and run elsewhere: it is not started (SPEC P1).
        self.intake.proof = self.clock.monotonic
        self.runner.before_start = self._expired_before_start
        stage_now(self.repo, self.config, self.topics)
        self._topic_watch.run_once()
        read_whole = getattr(self.repo, "read_whole", None)  # a Repo of brooq_py's (claim heads, SPEC B1)
        if read_whole is not None:
            read_whole()  # a script's claim sees every ready row, not only those past the head
        rows = self.intake.claim(min(self.config.workers, self.config.claim_batch))
        batched: list[Attempt] = []  # a batch kind's attempts: one call per batch, in this thread too
        for row in rows:
            a = self.intake.take_in(row)
            if a is not None:
                if a.kind.batch:
                    batched.append(a)
                else:
                    self.runner.run_here(a)
        self.runner.run_batches_here(batched)
        return len(rows)

    def _expired_before_start(self, a: Attempt) -> None:
        """run_once's check at a handler's start: the claim's lease (never renewed) about to end."""
        within = self.supervisor.fence_after
        if self.clock.monotonic() - a.proven_at >= within:
            cause = LeaseLost(
                f"its claim was {within:g}s old at its handler's start (run_once renews no lease)"
            )
            self.handover.hand_over(a, a.lost(cause))  # never started, nothing written for it ...
            self.intake.give_back([a.row])  # ... but the row, still this claim's: no crash counted

    def _defer(self, fn: Callable[[], None]) -> bool:
        """Run *fn* on a thread of its own when called from a handler's or a listener's thread, which it
        would wait for."""
        runner = self.runner
        if not (
            runner.threads.owns_current()
            or runner.settlers.owns_current()
            or self._async.on_loop()
            or self.events.owns_current()
        ):
            return False
        threading.Thread(target=fn, name="brooq-stop", daemon=True).start()
        return True


# The longest a stop waits for its handlers: past it, a wait is as good as forever (threading's waits
# refuse timeouts much longer than this).
_LONGEST_STOP_WAIT = 10.0**8


def _stop_wait(timeout: object) -> float | None:
    """``stop``'s *timeout* as seconds to wait (at least 0; ``math.inf`` the longest), or None."""
    if timeout is None:
        return None
    if isinstance(timeout, timedelta):
        timeout = timeout.total_seconds()
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise TypeError(
            f"stop: timeout must be seconds (a number or timedelta) or None, got {type(timeout).__name__}"
        )
    if timeout != timeout:  # NaN
        raise ValueError("stop: timeout must be a number of seconds, got nan")
    if timeout <= 0:
        return 0.0
    return _LONGEST_STOP_WAIT if timeout > _LONGEST_STOP_WAIT else float(timeout)

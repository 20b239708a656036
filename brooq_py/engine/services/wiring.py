"""Which periodic services an engine runs, built from its config in the order they start
(the engine stops them in the reverse order, ``stop_services``)."""

from __future__ import annotations

import functools
import logging
import os
import socket
import time
from collections.abc import Callable, Sequence

from brooq_py.engine.attempt.handover import Supervisor
from brooq_py.engine.attempt.inflight import InFlight
from brooq_py.engine.clock import Clock
from brooq_py.engine.config import Config
from brooq_py.engine.metrics import Metrics
from brooq_py.engine.services.cleanup import Reaper, Retention, reap
from brooq_py.engine.services.events import EventBus
from brooq_py.engine.services.liveness import Fence, Heartbeat, Watchdog
from brooq_py.engine.services.scheduler import Schedule, Scheduler, tick_enqueuer
from brooq_py.engine.services.ticker import Ticker
from brooq_py.queue import Job
from brooq_py.queue.port import EngineProof, Repo


def background_services(
    cfg: Config,
    repo: Repo,
    clock: Clock,
    metrics: Metrics,
    inflight: InFlight,
    supervisor: Supervisor,
    built: Sequence[Ticker],
    schedules: Sequence[Schedule],
    enqueued: Callable[[Job], None],
    log: logging.Logger,
    events: EventBus,
    worker_id: str,
    instance: str,
) -> list[Ticker]:
    """The heartbeat, watchdog and reaper, then *built* (the services the engine made itself), then the
    scheduler and retention when wanted; *enqueued* wakes the engine's services for its own jobs."""
    lease, margin = cfg.lease_td.total_seconds(), cfg.margin_td.total_seconds()
    fence = Fence(lease, margin, clock, supervisor.fence)
    proof = EngineProof(worker_id, socket.gethostname(), os.getpid(), cfg.lease_td, cfg.margin_td, instance)
    services: list[Ticker] = [
        Heartbeat(
            cfg.heartbeat_period.total_seconds(),
            proof,
            inflight,
            repo.beat,
            fence,
            supervisor,
            log,
            clock,
        ),
        Watchdog(inflight, supervisor, fence, clock, log),
        Reaper(
            cfg.effective_reaper_period,
            functools.partial(reap, repo, events),
            lambda t: metrics.child(metrics.reaped, t).inc(),
            log,
        ),
        *built,
    ]
    if schedules:
        services.append(
            Scheduler(
                schedules,
                tick_enqueuer(repo, metrics, enqueued),
                clock.now,
                lambda t, at: metrics.child(metrics.schedule_next, t).set(at),
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
                lambda t, n: metrics.child(metrics.retention_deleted, t).inc(n),
                log,
            )
        )
    return services


def stop_services(services: Sequence[Ticker], timeout: float = 10.0) -> None:
    """Halt every service at once, then wait for each, last started first, *timeout* seconds in
    all: a service stuck in a statement the database never answers is left behind (a daemon)."""
    for s in services:
        s.halt()
    deadline = time.monotonic() + timeout
    for s in reversed(services):
        s.stop(max(0.0, deadline - time.monotonic()))

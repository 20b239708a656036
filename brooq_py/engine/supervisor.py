"""Supervisor: what the engine does when a lease is lost, a handler overruns, or hangs (SPEC C3-C5, C11)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from brooq_py.engine.attempt import Attempt
from brooq_py.engine.inflight import InFlight
from brooq_py.engine.metrics import Metrics
from brooq_py.engine.outcome import Ending
from brooq_py.engine.runner import Runner
from brooq_py.engine.slots import SlotPool
from brooq_py.queue import LeaseLost, MaxExecutionExceeded


class Supervisor:
    """The heartbeat's and the watchdog's verdicts on running attempts, carried out.

    ``stopping()`` tells whether the engine is in its graceful stop; ``slots``
    is set when the engine starts.
    """

    def __init__(
        self,
        inflight: InFlight,
        runner: Runner,
        metrics: Metrics,
        grace_seconds: float,
        stopping: Callable[[], bool],
        log: logging.Logger,
    ) -> None:
        self.inflight = inflight
        self.runner = runner
        self.metrics = metrics
        self.grace = grace_seconds
        self.stopping = stopping
        self.log = log
        self.slots: SlotPool | None = None

    def lease_lost(self, a: Attempt) -> None:
        """The heartbeat found the row no longer ours: cancel the handler; nothing will be written."""
        if not self.inflight.drop(a):
            return  # an outcome write ended it meanwhile
        a.lost = True
        self.metrics.child(self.metrics.lease_lost, a.topic).inc()
        if a.ctx.cancel(LeaseLost("the row is no longer this claim's (canceled, reaped or taken over)")):
            self.log.warning(
                "job id=%s topic=%s attempt=%d: lease lost; cancelling the handler",
                a.id,
                a.topic,
                a.claim.attempt,
            )

    def give_up(self, a: Attempt) -> None:
        """max_execution_timeout: record a failed attempt (never dead for this alone), free the slot."""
        if not a.abandon():
            return
        hard = a.kind.options.td("max_execution_timeout").total_seconds()
        cause = MaxExecutionExceeded(f"max_execution_timeout of {hard:g}s elapsed")
        a.ctx.cancel(cause)
        self.log.error(
            "job id=%s topic=%s attempt=%d: still running after max_execution_timeout; "
            "recording a failed attempt and freeing the slot",
            a.id,
            a.topic,
            a.claim.attempt,
        )
        if not a.lost:
            self.runner.settle(a, Ending(cause=a.ctx.cause, gave_up=True, error=cause))
        self._release(a)

    def hung(self, a: Attempt) -> None:
        """Still running watchdog_grace after its cancel: report it, stop renewing, free the slot (C5)."""
        a.hung = True
        self.metrics.child(self.metrics.hung, a.topic).inc()
        self.log.error(
            "job id=%s topic=%s attempt=%d: handler hung: still running %gs after its context was "
            "cancelled (%s); its lease is no longer renewed",
            a.id,
            a.topic,
            a.claim.attempt,
            self.grace,
            type(a.ctx.cause).__name__,
        )
        if a.abandon():
            if self.stopping():
                self.hand_back(a)
            else:
                self.inflight.drop(a)
            self._release(a)

    def hand_back(self, a: Attempt) -> None:
        """At stop: a hung handler's row goes back to pending with its attempt given back (C11)."""
        if a.lost or a.stopping_hung:
            return
        a.stopping_hung = True
        self.runner.settle(a, Ending(cause=a.ctx.cause, stopping_hung=True))

    def _release(self, a: Attempt) -> None:
        if self.slots is not None:
            self.slots.release(a)

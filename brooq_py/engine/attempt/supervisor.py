"""Supervisor: the heartbeat's and the watchdog's verdicts on running attempts (SPEC C3-C5, C11, L1, L4).

Each verdict is one ending of the attempt's state machine; the first ending
wins, so a verdict that comes after the handler's own ending does nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from brooq_py.engine.attempt.attempt import Attempt, HandlerState, Phase
from brooq_py.engine.attempt.inflight import InFlight
from brooq_py.engine.attempt.outcome import Ending, decide
from brooq_py.engine.attempt.runner import Runner
from brooq_py.engine.metrics import Metrics
from brooq_py.queue import (
    AttemptTimeout,
    EngineStopping,
    JobCanceledByOperator,
    LeaseLost,
    MaxExecutionExceeded,
)


class Supervisor:
    """Carries out lease losses, fencing, timeouts, give-ups and hung verdicts."""

    def __init__(
        self,
        inflight: InFlight,
        runner: Runner,
        metrics: Metrics,
        grace_seconds: float,
        log: logging.Logger,
    ) -> None:
        self.inflight = inflight
        self.runner = runner
        self.metrics = metrics
        self.grace = grace_seconds
        self.log = log
        self.release_slot: Callable[[], None] = lambda: None

    def lease_lost(self, a: Attempt) -> None:
        """The heartbeat found the row no longer ours: cancel the handler; nothing will be written (C3).

        An attempt already settling is left alone: its outcome write is on its
        way and its guard decides (a renewal racing the write is no lost lease).
        """
        if not a.end(Phase.LOST):
            return
        self.metrics.child(self.metrics.lease_lost, a.topic).inc()
        a.ctx.cancel(LeaseLost("the row is no longer this claim's (canceled, reaped or taken over)"))
        self.log.warning(
            "job id=%s topic=%s attempt=%d: lease lost; cancelling the handler, nothing will be written",
            a.id,
            a.topic,
            a.claim.attempt,
        )
        self.runner.settle(a)

    def canceled(self, a: Attempt) -> None:
        """An operator canceled the running job (its NOTIFY, or the heartbeat found the row canceled
        under this claim): cancel the handler with ``JobCanceledByOperator``; nothing is written (X2')."""
        if not a.end(Phase.LOST):
            return
        self.metrics.child(self.metrics.lease_lost, a.topic).inc()  # a LeaseLost still, as it was counted
        a.ctx.cancel(JobCanceledByOperator("the job was canceled by an operator"))
        self.log.info(
            "job id=%s topic=%s attempt=%d: canceled by an operator; cancelling the handler, "
            "nothing will be written",
            a.id,
            a.topic,
            a.claim.attempt,
        )
        self.runner.settle(a)

    def fence(self, a: Attempt) -> None:
        """Renewals failed for a whole lease: others may run the job now; cancel and write nothing (L4)."""
        if not a.end(Phase.FENCED):
            return
        self.metrics.child(self.metrics.lease_lost, a.topic).inc()
        a.ctx.cancel(LeaseLost("the lease could not be renewed for a whole lease (fenced)"))
        self.log.error(
            "job id=%s topic=%s attempt=%d: no renewal for %gs: fencing (cancelling the handler, "
            "nothing will be written)",
            a.id,
            a.topic,
            a.claim.attempt,
            self.inflight.lease,
        )
        self.runner.settle(a)

    def timeout(self, a: Attempt) -> None:
        """attempt_timeout: cancel ctx; the handler's own ending decides (C4)."""
        seconds = a.kind.options.td("attempt_timeout").total_seconds()
        a.ctx.cancel(AttemptTimeout(f"attempt_timeout of {seconds:g}s elapsed"))

    def give_up(self, a: Attempt) -> None:
        """max_execution_timeout: stop waiting for the handler and free its slot; a failed attempt
        (never dead for this alone) is written once the handler ends or is declared hung (C4').

        Until then the lease is kept (renewed): the job cannot run again beside a handler that
        still runs in this engine. Only while the handler still runs: the watchdog's list may be
        a moment old, and a handler that returned since then is settled by its own ending.
        """
        if not a.give_up(Phase.GAVE_UP):
            return
        hard = a.kind.options.td("max_execution_timeout").total_seconds()
        cause = MaxExecutionExceeded(f"max_execution_timeout of {hard:g}s elapsed")
        a.ctx.cancel(cause)
        self.log.error(
            "job id=%s topic=%s attempt=%d: still running after max_execution_timeout; freeing the "
            "slot; the failed attempt is recorded when the handler ends or is declared hung",
            a.id,
            a.topic,
            a.claim.attempt,
        )
        self.release_slot()  # the handler was RUNNING: its slot is ours to free

    def hung(self, a: Attempt) -> None:
        """Still running watchdog_grace after its cancel: count it, free the slot, end the attempt (C5, L1).

        Hung ends the attempt without done, chain or on_succeeded, whatever the
        handler registered: at stop the row goes back to pending with its
        attempt given back (C11); otherwise the lease is left to expire.
        """
        was = a.handler_to(HandlerState.HUNG)
        if was is None:
            return
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
        if was is HandlerState.RUNNING:
            self.release_slot()
        if a.end(Phase.HUNG):
            self.runner.settle(a)
        elif a.ending is Phase.GAVE_UP:
            self.runner.settle_given_up(a)  # hung after it was given up: the job may run again now (C4')

    def release_at_stop(self, a: Attempt) -> None:
        """At stop, hand back the row of a handler hung before the stop (the reaper's work, done early).

        The attempt ended HUNG and wrote nothing; its attempt stays counted (C5,
        L5), and the guard makes this a no-op if the row moved on.
        """
        outcome = decide(
            id=a.id,
            claim_token=a.row.claim_token,
            topic=a.topic,
            attempt=a.claim.attempt,
            options=a.kind.options,
            ending=Ending(Phase.HUNG, cause=a.ctx.cause, stopping=True),
        )
        if outcome is not None:
            self.runner.put(outcome)

    def stopping_cancel(self, a: Attempt) -> None:
        a.ctx.cancel(EngineStopping("the engine is stopping"))

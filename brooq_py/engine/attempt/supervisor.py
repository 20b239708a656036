"""Supervisor: the heartbeat's and the watchdog's verdicts on running attempts (SPEC C3-C5, C11, L1, L4).

Each verdict is reported to the attempt, which ends by it unless another
ending came first, and answers the outcome to write (or None); the supervisor
hands that answer over.
"""

from __future__ import annotations

from brooq_py.engine.attempt.attempt import Attempt, Phase
from brooq_py.engine.attempt.handover import Handover
from brooq_py.engine.attempt.inflight import InFlight
from brooq_py.engine.attempt.outcome import Ending, decide
from brooq_py.queue import AttemptTimeout, EngineStopping, JobCanceledByOperator, LeaseLost


class Supervisor:
    """Carries out lease losses, fencing, timeouts, give-ups and hung verdicts."""

    def __init__(
        self, inflight: InFlight, handover: Handover, grace_seconds: float, fence_after: float
    ) -> None:
        self.inflight = inflight
        self.handover = handover
        self.grace = grace_seconds
        self.fence_after = fence_after  # lease - margin (F0)

    def lease_lost(self, a: Attempt) -> None:
        """The heartbeat found the row no longer ours: cancel the handler; nothing will be written (C3)."""
        cause = LeaseLost("the row is no longer this claim's (canceled, reaped or taken over)")
        self.handover.settle(a, a.lost(cause))

    def canceled(self, a: Attempt) -> None:
        """An operator canceled the running job (its NOTIFY, or the heartbeat found the row canceled
        under this claim): cancel the handler with ``JobCanceledByOperator``; nothing is written (X2')."""
        self.handover.settle(a, a.lost(JobCanceledByOperator("the job was canceled by an operator")))

    def fence(self, a: Attempt) -> None:
        """No heartbeat for lease - margin: others may run the job soon; cancel, write nothing (F0)."""
        self.handover.settle(a, a.fenced(self.fence_after))

    def timeout(self, a: Attempt) -> None:
        """attempt_timeout: cancel ctx; the handler's own ending decides (C4)."""
        seconds = a.kind.options.td("attempt_timeout").total_seconds()
        a.ctx.cancel(AttemptTimeout(f"attempt_timeout of {seconds:g}s elapsed"))

    def give_up(self, a: Attempt) -> None:
        """max_execution_timeout: stop waiting for the handler and free its slot (C4'); see
        ``Attempt.given_up``."""
        self.handover.settle(a, a.given_up())

    def hung(self, a: Attempt) -> None:
        """Still running watchdog_grace after its cancel (C5, L1); see ``Attempt.declared_hung``."""
        self.handover.settle(a, a.declared_hung(self.grace))

    def release_at_stop(self, a: Attempt) -> None:
        """At stop, hand back the row of a handler hung before the stop (the reaper's work, done early).

        The attempt ended HUNG and wrote nothing; its attempt stays counted (C5), and the claim
        token guard makes this a no-op if the row moved on.
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
            self.handover.put(outcome)

    def stopping_cancel(self, a: Attempt) -> None:
        a.ctx.cancel(EngineStopping("the engine is stopping"))

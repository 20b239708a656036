"""Hooks: what an attempt's moves touch outside it, and what they tell.

Its topic's room and its lease (the in-flight set), its slot, whether the
engine stops, the rng of backoff; and the log lines and counters of its
endings. The engine wires one ``Hooks`` for all its attempts; the defaults
serve a bare attempt (nothing counted, no slot, never stopping).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import TYPE_CHECKING

from brooq_py.engine.attempt.outcome import describe_error, what_then
from brooq_py.queue import JobCanceledByOperator, MustCancelTask, MustDelay, MustPreserveAttempt
from brooq_py.queue.errors import find_signal

if TYPE_CHECKING:
    from brooq_py.engine.attempt.attempt import Attempt
    from brooq_py.engine.metrics import Metrics
    from brooq_py.engine.repo import Outcome


def _nothing(*_args: object) -> None:
    return None


def _never() -> bool:
    return False


class Hooks:
    """One engine's attempts' surroundings (see the module)."""

    def __init__(
        self,
        log: logging.Logger | None = None,
        metrics: Metrics | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.log = log or logging.getLogger("brooq_py.engine")
        self.metrics = metrics
        self.rng = rng
        self.stopping: Callable[[], bool] = _never
        # The handler's code ended (``InFlight.end``): no longer running, its topic's room back (SPEC Q3).
        self.left_running: Callable[[Attempt], object] = _nothing
        # Nothing (more) is written for it (``InFlight.drop``): its claim is no longer reported on.
        self.let_go: Callable[[Attempt], object] = _nothing
        # ... and its row is still ours (hung, fenced): named dropped for the reaper (``InFlight.dropping``).
        self.drop_claim: Callable[[Attempt], object] = _nothing
        self.release_slot: Callable[[], None] = _nothing  # the engine's slots, from start()

    # --- what the endings tell ---------------------------------------------------

    def _tell(self, level: int, a: Attempt, what: str, *args: object) -> None:
        self.log.log(level, "job id=%s topic=%s attempt=%d: " + what, a.id, a.topic, a.claim.attempt, *args)

    def _count(self, counter: str, a: Attempt) -> None:
        if self.metrics is not None:
            self.metrics.child(getattr(self.metrics, counter), a.topic).inc()

    def lease_lost(self, a: Attempt, cause: BaseException) -> None:
        if isinstance(cause, JobCanceledByOperator):
            # The operator's cancel is the job's outcome (its statement wrote it): counted as one, not
            # as a lost lease, which tells of reaping, takeover and fencing.
            if self.metrics is not None:
                self.metrics.child(self.metrics.settled, a.topic, "canceled").inc()
            self._tell(
                logging.INFO, a, "canceled by an operator; cancelling the handler, nothing will be written"
            )
        else:
            self._count("lease_lost", a)
            self._tell(logging.WARNING, a, "lease lost; cancelling the handler, nothing will be written")

    def fenced(self, a: Attempt, lease: float) -> None:
        self._count("lease_lost", a)
        what = "no heartbeat for %gs: fencing (cancelling the handler, nothing will be written)"
        self._tell(logging.ERROR, a, what, lease)

    def gave_up(self, a: Attempt) -> None:
        what = (
            "still running after max_execution_timeout; freeing the slot; the failed attempt is "
            "recorded when the handler ends or is declared hung"
        )
        self._tell(logging.ERROR, a, what)

    def hung(self, a: Attempt, grace: float) -> None:
        self._count("hung", a)
        what = "handler hung: still running %gs after its context was cancelled (%s); its claim is dropped for the reaper"
        self._tell(logging.ERROR, a, what, grace, type(a.ctx.cause).__name__)

    def late(self, a: Attempt, error: BaseException | None) -> None:
        how = "returned" if error is None else f"raised {describe_error(error)}"
        self._tell(
            logging.WARNING, a, "handler %s after the attempt ended (%s); nothing written", how, a.phase
        )

    def failed(self, a: Attempt, error: BaseException, outcome: Outcome) -> None:
        then = what_then(outcome)  # the last attempt's failure says the job is now dead
        if any(find_signal(error, s) is not None for s in (MustCancelTask, MustDelay, MustPreserveAttempt)):
            self._tell(logging.INFO, a, "handler signalled %s%s", describe_error(error), then)
            return
        self.log.error(
            "job id=%s topic=%s attempt=%d/%d failed: %s%s",
            a.id,
            a.topic,
            a.claim.attempt,
            a.claim.max_attempts,
            describe_error(error),
            then,
            exc_info=error,
        )

"""Late outcomes: answers written after their attempt's end (SPEC L5, L6').

Two kinds, one tick every PERIOD seconds:

- A poison verdict (a claim past ``max_attempts``, never run) is held back one
  lease, its lease renewed meanwhile, then handed over (``Handover.release_held``):
  the attempt before may have returned in an engine that could not write its
  done then, and that engine's write, if it comes in time, wins over the verdict.
- A done this engine gave up with the store (its lease lost while every write
  failed, L6) is written again under its own claim token until it is written or
  its row is found to be someone else's: the row still processing under that
  claim (its lease expired, nobody took it), returned to pending by the reaper
  and not claimed since, or - a last attempt - held by the poison claim that came
  next (``Repo.settle_lost``). Its chained jobs and callbacks go with it in one
  transaction, as at its first try (C9). A store still unreachable fails the tick:
  it is tried again at the next.

A row claimed again and run (not the last attempt), ended, canceled or retried
since is left alone and the done forgotten: outcomes are written once (P3).
"""

from __future__ import annotations

import logging
import time

from brooq_py.engine.attempt.attempt import Attempt, Phase
from brooq_py.engine.attempt.handover import EVENT_OF, Handover
from brooq_py.engine.attempt.held import LATE_LOCKED_MAX
from brooq_py.engine.attempt.outcome import Ending, decide
from brooq_py.engine.repo import Outcome, Repo
from brooq_py.engine.services.ticker import Ticker
from brooq_py.queue import State, StoreUnavailable

PERIOD = 0.25
# A lost done whose row another transaction holds locked is tried again after PERIOD, doubling up to this
# (a poison verdict held back for it and meeting the same lock waits for it: attempt/held.py).
LOCKED_MAX = LATE_LOCKED_MAX


class _NotOurs(Exception):
    """The row is no longer the lost attempt's (claimed again and run, ended, canceled)."""


class _Locked(Exception):
    """Another transaction holds the row locked: nothing written, tried again next tick (L3')."""


class _ClosingFailed(Exception):
    """A chained job or a callback of the lost done raised (not the store): a failed attempt (C9)."""


class LateOutcomes(Ticker):
    """Hands over held poison verdicts when due and writes the dones this engine lost (see the module)."""

    name = "late-outcomes"
    backoff_base = PERIOD

    def __init__(self, handover: Handover, repo: Repo, log: logging.Logger, period: float = PERIOD) -> None:
        super().__init__(period, log)
        self._handover = handover
        self._repo = repo
        self._locked: dict[str, tuple[float, float]] = {}  # job id -> (next try, wait): rows locked elsewhere

    def tick(self) -> None:
        self._handover.release_held()
        now = time.monotonic()
        failed: Exception | None = None
        for a in self._handover.lost():
            if self._locked.get(a.id, (0.0, 0.0))[0] > now:
                continue  # its row was locked elsewhere: tried again after its backoff (L3')
            try:
                self._write(a)
            except StoreUnavailable:
                raise  # the others would fail as well: next tick
            except Exception as exc:  # only its own write fails: the others go on (L3')
                failed = failed or exc
        remembered = {a.id for a in self._handover.lost()}
        self._locked = {k: v for k, v in self._locked.items() if k in remembered}
        if failed is not None:
            raise failed  # logged by the ticker's rule; the next tick tries again

    def _write(self, a: Attempt) -> None:
        """Write *a*'s lost done (or the failure of its closing work); StoreUnavailable: next tick."""
        outcome = Outcome(
            id=a.id, claim_token=a.row.claim_token, state=State.DONE, topic=a.topic, result=a.result
        )
        try:
            written = self._close(a, outcome, closing=True)
        except _Locked:
            # Still remembered, nobody waiting on the lock (L3'): tried again later, backing off so
            # that closing work rolled back with a locked row is not run again every tick.
            wait = min(LOCKED_MAX, 2 * self._locked.get(a.id, (0.0, self.period / 2))[1])
            self._locked[a.id] = (time.monotonic() + wait, wait)
            return
        except _ClosingFailed as failed:
            error = failed.__cause__ or failed
            self.log.error(
                "job id=%s topic=%s attempt=%d: closing transaction of a done written late failed; "
                "recording a failed attempt",
                a.id,
                a.topic,
                a.claim.attempt,
                exc_info=error,
            )
            answer = decide(
                id=a.id,
                claim_token=a.row.claim_token,
                topic=a.topic,
                attempt=a.claim.attempt,
                options=a.kind.options,
                ending=Ending(Phase.RAISED, error=error),
            )
            if answer is None:  # pragma: no cover - a raise always has an outcome
                self._handover.forget_lost(a)
                return
            outcome = answer
            try:
                written = self._close(a, outcome, closing=False)
            except _Locked:
                return  # pragma: no cover - the closing transaction just found the row free
        self._handover.forget_lost(a)
        if not written:
            self.log.info(
                "job id=%s topic=%s attempt=%d: the done lost with the store is not written: the row "
                "was claimed again, ended or canceled since",
                a.id,
                a.topic,
                a.claim.attempt,
            )
            return
        self._told(a, outcome)

    def _close(self, a: Attempt, outcome: Outcome, *, closing: bool) -> bool:
        """Write *outcome* under the lost claim; False when the row is someone else's.

        With closing work (*closing*, chained jobs or callbacks) in one transaction, the row last,
        all of it rolled back when the row is not ours; what that work raises, unless the store is
        unreachable, is ``_ClosingFailed``. The store's own errors pass (tried again next tick)."""
        claim, repo = a.claim, self._repo
        last = claim.attempt >= a.kind.options.max_attempts
        worker = a.row.locked_by
        if not (closing and claim.has_closing_work):
            answer = repo.settle_lost(outcome, claim.attempt, worker, last)
            if answer is None:
                raise _Locked
            return answer
        in_closing_work = True
        try:
            with repo.begin() as tx:
                for job in claim.chained:
                    if job.unique_key is None:
                        repo.enqueue_tx(tx, job)
                for fn in claim.callbacks:
                    fn(tx)
                in_closing_work = False
                answer = repo.settle_lost(outcome, claim.attempt, worker, last, tx)
                if answer is None:
                    raise _Locked  # the closing work rolls back with it, done again next tick
                if not answer:
                    raise _NotOurs
                in_closing_work = True
                for job in [j for j in claim.chained if j.unique_key is not None]:
                    repo.enqueue_tx(tx, job)  # after the done, which frees this job's key (U2)
                in_closing_work = False
        except _NotOurs:
            return False
        except (StoreUnavailable, _Locked):
            raise
        except BaseException as exc:  # SystemExit, KeyboardInterrupt too: the attempt settles (C11')
            if in_closing_work:
                raise _ClosingFailed(str(exc)) from exc
            raise
        return True

    def _told(self, a: Attempt, outcome: Outcome) -> None:
        """Count and tell a late write as the first try would have (SPEC N1, O1)."""
        handover = self._handover
        metrics = handover.metrics
        metrics.child(metrics.settled, a.topic, str(outcome.state)).inc()
        handover.on_settled((a.topic,))  # a limited topic may have room again (SPEC Q3)
        if outcome.state is State.DONE:
            for job in a.claim.chained:
                metrics.child(metrics.enqueued, job.topic).inc()
        elif outcome.state is State.FAILED:
            handover.on_waiting()
        events = handover.events
        if events is not None and events.active:
            error = outcome.last_error if outcome.state in (State.FAILED, State.DEAD) else None
            events.emit(EVENT_OF[outcome.state], a.id, a.topic, a.claim.attempt, error)
        self.log.warning(
            "job id=%s topic=%s attempt=%d: %s written now, under its own claim: its handler had "
            "returned while the store was unreachable (L6')",
            a.id,
            a.topic,
            a.claim.attempt,
            outcome.state,
        )

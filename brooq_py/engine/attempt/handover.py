"""Handover: where an attempt's answer goes, and what comes back (SPEC C3-C11, F0, N1, O4, Q3, S7, U2, X2').

Every outcome is one idempotent statement guarded by the claim token, batched by
the completer (an ``OutcomeSink``, declared here so that the attempt's modules never
import a service) or written at once without one. A done with closing work
(``chain``/``on_succeeded``) has its own transaction, which locks its row first
without waiting on another's lock; a locked row or an unreachable store hands it to
the completer to be tried again.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from brooq_py.engine.attempt.attempt import Attempt
from brooq_py.engine.attempt.inflight import InFlight
from brooq_py.engine.attempt.outcome import Ending, Phase
from brooq_py.engine.metrics import Metrics
from brooq_py.queue import (
    AttemptTimeout,
    EngineStopping,
    JobCanceledByOperator,
    LeaseLost,
    State,
    StoreUnavailable,
)
from brooq_py.queue.job import EventKind
from brooq_py.queue.port import Outcome, Repo, was_written

# The event each written outcome is (a handed-back attempt is a requeue).
EVENT_OF: dict[State, EventKind] = {
    State.DONE: "done",
    State.FAILED: "failed",
    State.DEAD: "dead",
    State.CANCELED: "canceled",
    State.PENDING: "requeued",
    State.SCHEDULED: "requeued",  # a sleep, a wait for a signal, a Snooze
}

# Outcomes that leave the job waiting for a time (or a signal): the stager must look again.
_WAITING = frozenset({State.FAILED, State.SCHEDULED})
# Outcomes that give the job back to the queue rather than settle it.
_REQUEUED = frozenset({State.PENDING, State.SCHEDULED})

RETRY_IN_PLACE = 0.25  # without a completer: the wait before a write whose row was locked is tried again


class OutcomeSink(Protocol):
    """Takes outcomes to write later, in a batch: ``services.completer.Completer``."""

    def has_room(self) -> bool: ...

    def put_many(self, outcomes: Sequence[Outcome]) -> bool: ...

    def offer(self, outcome: Outcome) -> bool: ...

    def put(self, outcome: Outcome) -> bool: ...

    def retry(self, fn: Callable[[], bool], abandon: Callable[[], None]) -> bool: ...


class EventSink(Protocol):
    """Takes events to deliver after their commit: ``services.events.EventBus``."""

    @property
    def active(self) -> bool: ...

    def emit(
        self, kind: EventKind, job_id: str, topic: str, attempt: int, error: str | None = None
    ) -> None: ...


class _NotOurs(Exception):
    """The closing transaction found the row no longer this claim's."""


class _Locked(Exception):
    """The closing transaction found the row held by another transaction."""


class Handover:
    """Takes each attempt's answer to where it is written, and settles the attempts written."""

    def __init__(self, repo: Repo, inflight: InFlight, metrics: Metrics, log: logging.Logger) -> None:
        self.repo = repo
        self.inflight = inflight
        self.metrics = metrics
        self.log = log
        self.completer: OutcomeSink | None = None  # None: write each outcome at once (run_once)
        self.sleep: Callable[[float], None] = time.sleep
        # A failed attempt's retry time was written: no NOTIFY announces it, the stager must look.
        self.on_waiting: Callable[[], None] = lambda: None
        self.events: EventSink | None = None
        self.on_settled: Callable[[Iterable[str]], None] = lambda topics: None  # their topics' room
        # Whether a dead job of the topic lets its sequence go on (KindOptions.sequence_on_dead).
        self.passes_dead: Callable[[str], bool] = lambda topic: False

    def hand_over(self, a: Attempt, outcome: Outcome | None) -> None:
        """Take *a*'s answer where it is written; None: nothing to write (the attempt settled itself)."""
        self.hand_over_many([(a, outcome)])

    def hand_over_many(self, answers: Sequence[tuple[Attempt, Outcome | None]]) -> None:
        """``hand_over`` for several attempts: the plain outcomes reach the completer together."""
        plain = []
        for a, outcome in answers:
            if outcome is None:
                continue
            if outcome.state is State.DONE and a.claim.has_closing_work:
                self._close(a, outcome)
            else:
                plain.append(outcome)
        completer = self.completer
        if plain and completer is not None and completer.put_many(plain):
            return
        for outcome in plain:
            self.write(outcome)

    def offer(self, outcome: Outcome) -> bool:
        """Give *outcome* to the completer without waiting; False when that cannot be done now."""
        completer = self.completer
        return completer is not None and completer.offer(outcome)

    def has_room(self) -> bool:
        """Whether ``offer`` would take an outcome now."""
        completer = self.completer
        return completer is not None and completer.has_room()

    def write(self, outcome: Outcome) -> None:
        """Have *outcome* written: by the completer, or at once without one or once it stopped."""
        completer = self.completer
        if completer is not None and completer.put(outcome):
            return
        batch = [outcome]
        while True:
            written = self.repo.settle_many(batch)
            if outcome.claim_token not in getattr(written, "locked", ()) or not self._holds(outcome):
                break
            self.sleep(RETRY_IN_PLACE)  # its row is locked elsewhere: never waited on, tried again
        self.on_written(batch, written)

    def _holds(self, outcome: Outcome) -> bool:
        return self.inflight.by_token(outcome.claim_token) is not None

    def on_written(self, batch: Sequence[Outcome], written: set[str]) -> None:
        settled: Counter[tuple[str, str]] = Counter()
        if any(was_written(written, o) and o.state in _WAITING for o in batch):
            self.on_waiting()
        events = self.events if self.events is not None and self.events.active else None
        for o in batch:
            a = self.inflight.drop_outcome(o)
            if a is not None:
                a.settled()
            if not was_written(written, o):
                self.log.info(
                    "job id=%s topic=%s: %s not written: the row was no longer this claim's",
                    o.id,
                    o.topic,
                    o.state,
                )
                continue
            if o.state not in _REQUEUED:
                settled[(o.topic, str(o.state))] += 1
            if events is not None:
                error = o.last_error if o.state in (State.FAILED, State.DEAD) else None
                events.emit(EVENT_OF[o.state], o.id, o.topic, 0 if a is None else a.claim.attempt, error)
        for (topic, state), n in settled.items():  # one counter update per (topic, outcome) a batch
            self.metrics.child(self.metrics.settled, topic, state).inc(n)
        self._pass_dead(batch, written)
        self.on_settled({o.topic for o in batch})

    def _pass_dead(self, batch: Sequence[Outcome], written: set[str]) -> None:
        """SPEC Q5: dead jobs of kinds whose sequences go on past them; an error leaves the sequence
        halted, as with "halt" (``resume_sequence`` releases it)."""
        dead = [
            o.id
            for o in batch
            if o.state is State.DEAD and was_written(written, o) and self.passes_dead(o.topic)
        ]
        if not dead:
            return
        try:
            self.repo.pass_dead(dead)
        except Exception:
            self.log.exception(
                "dead jobs %s: their sequences stay halted (resume_sequence releases them)", dead
            )

    def _close(self, a: Attempt, done: Outcome) -> None:
        """Done, chained enqueues and on_succeeded in one transaction, tried until written or not ours."""
        if self._close_once(a, done):
            return
        completer = self.completer
        if completer is not None and completer.retry(
            functools.partial(self._close_once, a, done), functools.partial(self._abandon, a)
        ):
            return
        while not self._close_once(a, done) and self._holds(done):
            self.sleep(RETRY_IN_PLACE)

    def _close_once(self, a: Attempt, done: Outcome) -> bool:
        """One try; False when it must be tried again (its row locked elsewhere, the store unreachable)."""
        claim = a.claim
        try:
            with self.repo.begin() as tx:
                row = self.repo.lock_own_tx(tx, done)  # go on only with our row, locked by us now
                if row == "locked":
                    raise _Locked("its row is locked by another transaction")
                if row != "ours":
                    raise _NotOurs
                for job in claim.chained:
                    if job.unique_key is None:
                        self.repo.enqueue_tx(tx, job)
                for fn in claim.callbacks:
                    fn(tx)
                if not self.repo.settle_tx(tx, done):
                    raise _NotOurs  # pragma: no cover - the row is locked by this transaction
                for job in [j for j in claim.chained if j.unique_key is not None]:
                    self.repo.enqueue_tx(tx, job)  # after the done, which frees this job's key
        except _NotOurs:
            a.let_go()
            self.log.info("job id=%s topic=%s: done not written: the row was no longer ours", a.id, a.topic)
            return True
        except _Locked:
            self.log.info(
                "job id=%s topic=%s: its row is locked by another transaction; the closing transaction "
                "(chain, on_succeeded) is tried again once the lock is gone",
                a.id,
                a.topic,
            )
            return False
        except StoreUnavailable as exc:
            self.log.warning(
                "job id=%s topic=%s: closing transaction failed (%s); tried again", a.id, a.topic, exc
            )
            return False
        except BaseException as exc:  # SystemExit, KeyboardInterrupt too: the attempt settles
            self.log.error(
                "job id=%s topic=%s attempt=%d: closing transaction failed; recording a failed attempt",
                a.id,
                a.topic,
                claim.attempt,
                exc_info=exc,
            )
            outcome = a.closing_failed(exc)
            if outcome is not None:
                self.write(outcome)
            if not isinstance(exc, Exception) and threading.current_thread() is threading.main_thread():
                raise  # run_once in the caller's thread: its Ctrl-C or exit goes on, the row settled
            return True
        a.let_go()
        self.metrics.child(self.metrics.settled, a.topic, "done").inc()
        self.on_settled((a.topic,))
        if self.events is not None:
            self.events.emit("done", a.id, a.topic, claim.attempt)
        for job in claim.chained:
            self.metrics.child(self.metrics.enqueued, job.topic).inc()
        return True

    def _abandon(self, a: Attempt) -> None:
        """The engine stopped with this closing transaction unwritten: the reaper returns the job."""
        a.let_go(unsettled=True)
        self.log.warning(
            "job id=%s topic=%s: done not written at stop (its row locked elsewhere or the store "
            "unreachable); the reaper returns the job",
            a.id,
            a.topic,
        )


class Supervisor:
    """Reports the verdicts from outside the handler to its attempt and hands the answer over."""

    def __init__(
        self, inflight: InFlight, handover: Handover, grace_seconds: float, fence_after: float
    ) -> None:
        self.handover = handover
        self.inflight = inflight
        self.grace = grace_seconds
        self.fence_after = fence_after  # lease - margin

    def lease_lost(self, a: Attempt) -> None:
        """The heartbeat found the row no longer this claim's."""
        cause = LeaseLost("the row is no longer this claim's (canceled, reaped or taken over)")
        self.handover.hand_over(a, a.lost(cause))

    def canceled(self, a: Attempt) -> None:
        """An operator canceled the running job: its NOTIFY, or the heartbeat found it so."""
        self.handover.hand_over(a, a.lost(JobCanceledByOperator("the job was canceled by an operator")))

    def fence(self, a: Attempt) -> None:
        """No heartbeat succeeded for lease - margin."""
        self.handover.hand_over(a, a.fenced(self.fence_after))

    def timeout(self, a: Attempt) -> None:
        """attempt_timeout: cancel ctx; the handler's own ending decides."""
        seconds = a.kind.options.td("attempt_timeout").total_seconds()
        a.ctx.cancel(AttemptTimeout(f"attempt_timeout of {seconds:g}s elapsed"))

    def give_up(self, a: Attempt) -> None:
        """max_execution_timeout."""
        self.handover.hand_over(a, a.given_up())

    def declare_hung(self, a: Attempt) -> None:
        """Still running watchdog_grace after its cancel: its claim let go, the heartbeat says so now."""
        self.handover.hand_over(a, a.declared_hung(self.grace))
        self.inflight.on_unheld_end()

    def release_at_stop(self, a: Attempt) -> None:
        """At stop, hand back the row of a handler hung before the stop: the reaper's work, done early."""
        outcome = a.decide(Ending(Phase.HUNG, cause=a.ctx.cause, stopping=True))
        if outcome is not None:
            self.handover.write(outcome)

    def stopping_cancel(self, a: Attempt) -> None:
        a.ctx.cancel(EngineStopping("the engine is stopping"))

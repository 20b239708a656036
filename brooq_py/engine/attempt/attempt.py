"""Attempt: one claimed job in this engine, a state machine (SPEC L1, C3-C9, F0, L5', Q3, V1, X2').

Two machines share one lock. ``phase`` is the attempt's ending::

    CLAIMED ──▶ RUNNING ──▶ RETURNED | RAISED | HUNG | LOST | GAVE_UP | FENCED | UNRUN
       │                               │
       └──▶ POISONED                   └──▶ SETTLING ──▶ SETTLED

The first ending wins: a handler that returns after the watchdog called it hung
finds the attempt ended and writes nothing. ``handler`` is the life of the
handler's code (a thread or a task), which may outlive the attempt's ending:
RUNNING ──▶ ENDED, or ──▶ ABANDONED (the engine stopped waiting: slot freed) /
HUNG (counted, slot freed) and later ──▶ ENDED. Whoever moves the handler out of
RUNNING owns the slot's release. A move not in the tables raises
``IllegalTransition``: a bug, never a race.

The Attempt owns its moves: whoever sees how it ended (runner, supervisor,
intake) reports it, and ``decide()`` answers the outcome to write, or None;
the reporter hands it over, and what lies outside comes through ``Hooks``.
"""

from __future__ import annotations

import inspect
import logging
import math
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from brooq_py.engine.attempt.outcome import (
    ENDINGS,
    HANDLER,
    PHASES,
    Ending,
    HandlerState,
    IllegalTransition,
    Phase,
    decide,
    describe_error,
    what_then,
)
from brooq_py.queue import (
    Claim,
    Context,
    JobCanceledByOperator,
    KindOptions,
    Lease,
    LeaseLost,
    MaxExecutionExceeded,
    MustCancelTask,
    MustDelay,
    MustPreserveAttempt,
    Snooze,
    StoreUnavailable,
)
from brooq_py.queue.claim import Parent
from brooq_py.queue.errors import find_signal
from brooq_py.queue.port import ClaimedJob, Outcome, StepPort

if TYPE_CHECKING:
    from brooq_py.engine.metrics import Metrics


@dataclass(frozen=True)
class Kind:
    """A registered topic: its handler (resolved to a callable) and options."""

    topic: str
    handler: Callable[[Context, Claim], Any]
    options: KindOptions
    is_async: bool
    # Engine.register_batch: the handler takes a list of claims and answers one result each (BD1).
    batch: bool = False

    @classmethod
    def build(cls, topic: str, handler: object, options: KindOptions, *, batch: bool = False) -> Kind:
        """Resolve *handler* (a function, an async function or an object with ``.handle``)."""
        fn: Any = handler
        if not inspect.isroutine(handler) and callable(getattr(handler, "handle", None)):
            fn = handler.handle  # type: ignore[attr-defined]
        if not callable(fn):
            raise TypeError("handler must be a function, an async function or an object with .handle")
        is_async = inspect.iscoroutinefunction(fn) or (
            not inspect.isroutine(fn) and inspect.iscoroutinefunction(type(fn).__call__)
        )
        return cls(topic=topic, handler=fn, options=options, is_async=is_async, batch=batch)


class Poisoned(Exception):
    """Why a claimed job is not run again but dead."""


class Attempt:
    """The engine's record of one claim while it is ours (see the module's tables)."""

    __slots__ = (
        "_code_ended",
        "_ending",
        "_handler",
        "_hooks",
        "_lock",
        "_owns_slot",
        "_phase",
        "called",
        "cancelled_at",
        "claim",
        "ctx",
        "ctx_cancelled_at",
        "hard_deadline",
        "kind",
        "proven_at",
        "result",
        "row",
        "soft_deadline",
    )

    def __init__(
        self,
        row: ClaimedJob,
        kind: Kind,
        started: float,
        ctx: Context,
        parents: Callable[[str], list[Parent]] | None = None,
        hooks: Hooks | None = None,
        steps: StepPort | None = None,
    ) -> None:
        opts = kind.options
        self.row = row
        self.kind = kind
        self.ctx = ctx
        self.claim = Claim(
            id=row.id,
            topic=row.topic,
            payload=row.payload,
            attempt=row.attempts,
            max_attempts=opts.max_attempts,
            lease=Lease(row.locked_by, row.locked_until),
            claim_token=row.claim_token,
            priority=row.priority,
            parents=parents,
            meta=row.meta,
        )
        ctx.attach(self.claim, steps, unrecorded=row.unrecorded)
        self.result: str | None = None  # the handler's return value as JSON text
        self.called = False  # its handler was called (``call()``, right before the call)
        self.soft_deadline = started + opts.td("attempt_timeout").total_seconds()
        self.hard_deadline = started + opts.td("max_execution_timeout").total_seconds()
        # When its handler was told to stop (the watchdog's grace counts from it) and when its own
        # context was cancelled: the same for a single handler; a batch call is told only once every
        # job of the call is cancelled (batch.call_handler), the last of these times.
        self.cancelled_at: float | None = None
        self.ctx_cancelled_at: float | None = None
        # The send time of the engine's proof of life the claim was made under, or of the last beat
        # that found the claim held (SPEC F0, P1; liveness.Fence.proof_of); inf: no fence here.
        self.proven_at = math.inf
        self._lock = threading.Lock()
        self._phase = Phase.CLAIMED
        self._ending: Phase | None = None
        self._handler = HandlerState.RUNNING
        self._hooks = hooks if hooks is not None else Hooks()
        self._code_ended = False  # the handler's code ended and was told to the hooks
        self._owns_slot = False  # its own end took the handler out of RUNNING: the slot is its to free

    @property
    def id(self) -> str:
        return self.row.id

    @property
    def topic(self) -> str:
        return self.row.topic

    @property
    def phase(self) -> Phase:
        return self._phase

    @property
    def ending(self) -> Phase | None:
        """How the attempt ended (one of ENDINGS), or None while it runs."""
        return self._ending

    @property
    def handler(self) -> HandlerState:
        return self._handler

    @property
    def hung(self) -> bool:
        return self._handler is HandlerState.HUNG

    # --- the ending -------------------------------------------------------

    def _move(self, to: Phase) -> None:
        if to not in PHASES[self._phase]:
            raise IllegalTransition(f"attempt {self.id}: {self._phase} -> {to}")
        self._phase = to

    def start(self) -> None:
        """CLAIMED -> RUNNING: held by the engine, its handler on its way (``InFlight.add``)."""
        with self._lock:
            self._move(Phase.RUNNING)

    def call(self) -> BaseException | None:
        """The handler is about to be called: mark it ``called`` and answer None, or answer why it
        must not start (``unstarted``), in one move with the watchdog's verdict, which hands an
        attempt never called back unrun (``declared_hung``)."""
        with self._lock:
            cause = unstarted(self)
            if cause is None:
                self.called = True
            return cause

    def end(self, ending: Phase) -> bool:
        """Record how the attempt ended; False if another ending came first (a normal race)."""
        if ending not in ENDINGS:
            raise IllegalTransition(f"attempt {self.id}: {ending} is not an ending")
        with self._lock:
            return self._end_locked(ending)

    def _end_locked(self, ending: Phase) -> bool:
        if ending not in PHASES[self._phase]:
            if self._phase in (Phase.CLAIMED, Phase.RUNNING):
                raise IllegalTransition(f"attempt {self.id}: {self._phase} -> {ending}")
            return False
        self._phase = self._ending = ending
        return True

    def settling(self) -> Phase:
        """Ending -> SETTLING; return the ending being settled. Raise if there is none (a second settle)."""
        with self._lock:
            ending = self._phase
            if ending not in ENDINGS:
                raise IllegalTransition(f"attempt {self.id}: settling from {ending}")
            self._move(Phase.SETTLING)
            return ending

    def settling_if(self, ending: Phase) -> bool:
        """*ending* -> SETTLING; False when another took it (a given-up end and its hung verdict both ask)."""
        with self._lock:
            if self._phase is not ending:
                return False
            self._phase = Phase.SETTLING
            return True

    def settled(self) -> None:
        """SETTLING -> SETTLED: the outcome was written, found not ours, or there is none to write."""
        with self._lock:
            self._move(Phase.SETTLED)

    # --- the handler's life ------------------------------------------------

    def handler_to(self, to: HandlerState) -> HandlerState | None:
        """Move the handler's state; return the previous one, or None when not allowed (a normal race)."""
        with self._lock:
            was = self._handler
            if to not in HANDLER[was]:
                if to is HandlerState.ENDED:
                    raise IllegalTransition(f"attempt {self.id}: handler ended twice")
                return None
            self._handler = to
            return was

    # --- how it ended, reported: each answers the outcome to write, or None --------

    def code_ended(self) -> HandlerState | None:
        """Record at once, before the watchdog may call it hung, that the handler's code ended; return
        the handler's state before (None: recorded already)."""
        if self._code_ended:
            return None
        self._code_ended = True
        was = self.handler_to(HandlerState.ENDED)
        self._owns_slot = was is HandlerState.RUNNING  # otherwise the engine freed it when it stopped waiting
        self._hooks.left_running(self)
        return was

    def free_slot(self) -> None:
        """Free the handler's slot, once, if its own end took it out of RUNNING (its outcome on its way)."""
        with self._lock:
            owns, self._owns_slot = self._owns_slot, False
        if owns:
            self._hooks.release_slot()

    def returned(self) -> Outcome | None:
        """The handler returned (its value in ``result``): done, unless another ending came first."""
        self.code_ended()
        if self.end(Phase.RETURNED):
            return self._answer(None)
        return self._after_another(None)

    def raised(self, error: BaseException) -> Outcome | None:
        """The handler raised *error* (any BaseException): a failed attempt, a signal's outcome."""
        self.code_ended()
        if self.end(Phase.RAISED):
            return self._answer(error)
        return self._after_another(error)

    def lost(self, cause: LeaseLost) -> Outcome | None:
        """The row is no longer this claim's: cancel the handler with *cause*, write nothing."""
        if not self.end(Phase.LOST):
            return None
        self._hooks.tell_lost(self, cause)  # counted before the handler can see its cancel
        self.ctx.cancel(cause)
        return self._answer(None)

    def fenced(self, seconds: float) -> Outcome | None:
        """No heartbeat succeeded for *seconds*: others may run the job soon; cancel, write nothing."""
        if not self.end(Phase.FENCED):
            return None
        self._hooks.tell_fenced(self, seconds)
        self.ctx.cancel(LeaseLost(f"no heartbeat succeeded for {seconds:g}s (fenced)"))
        return self._answer(None)

    def given_up(self) -> Outcome | None:
        """max_execution_timeout: stop waiting for the handler, free its slot, keep its lease (so the job
        cannot run again beside it) until its end or hung verdict writes the failure."""
        with self._lock:  # the ending and the abandoned handler in one move
            if self._handler is not HandlerState.RUNNING or Phase.GAVE_UP not in PHASES[self._phase]:
                return None
            self._phase = self._ending = Phase.GAVE_UP
            self._handler = HandlerState.ABANDONED
        self.ctx.cancel(self._max_execution_exceeded())
        self._hooks.tell_gave_up(self)
        self._hooks.release_slot()  # the handler was RUNNING: its slot is ours to free
        return None

    def declared_hung(self, grace: float) -> Outcome | None:
        """Still running *grace* seconds after its cancel: count it, free the slot, end without done.
        The hung handler and the ending in one move: a handler that returns once it is called hung
        finds the attempt ended (it used to find it still running, between the two, and write done).
        A handler never called (its start stalled) hangs nowhere: the attempt ends UNRUN, handed
        back with its attempt given back, and ``call()`` never lets it start."""
        with self._lock:
            was = self._handler
            if HandlerState.HUNG not in HANDLER[was]:
                return None
            called = self.called
            ended = self._end_locked(Phase.HUNG if called else Phase.UNRUN)
            self._handler = HandlerState.HUNG
        if called:
            self._hooks.tell_hung(self, grace)
        elif ended:
            self._hooks.tell_unstarted(self, grace)
        if was is HandlerState.RUNNING:
            self._hooks.release_slot()
        if ended:
            return self._answer(None)
        return self._given_up_failure() if self._ending is Phase.GAVE_UP else None

    def poisoned(self, why: str) -> Outcome | None:
        """Never run: dead, *why* its last error."""
        self.end(Phase.POISONED)
        self._hooks.left_running(self)
        return self._answer(Poisoned(why))

    def unrun(self) -> Outcome | None:
        """Its handler never ran and never will (its take-in failed): handed back, its attempt given
        back; None when another ending came first (that one's outcome is written)."""
        if not self.end(Phase.UNRUN):
            return None
        return self._answer(None)

    def closing_failed(self, error: BaseException) -> Outcome | None:
        """The closing transaction of a done raised: recorded as a raise of the handler."""
        outcome = self.decide(Ending(Phase.RAISED, error=error, cause=self.ctx.cause))
        if outcome is None:
            self.let_go()
        return outcome

    def let_go(self, unsettled: bool = False) -> None:
        """Nothing (more) is written for this attempt: stop holding its claim; settled. *unsettled*:
        its row may still be processing under the claim (hung, fenced): the reaper's to take back."""
        self._hooks.let_go(self)
        if unsettled:
            self._hooks.drop_claim(self)
        self.settled()

    # --- answering ----------------------------------------------------------

    def _answer(self, error: BaseException | None) -> Outcome | None:
        """Settle the ending just reached, exactly once, through ``decide()``."""
        return self._decided(self.settling(), error)

    def _after_another(self, error: BaseException | None) -> Outcome | None:
        """The handler ended after another ending: only a given-up attempt's failure is left to write."""
        if self._ending is Phase.GAVE_UP:
            return self._given_up_failure()
        self._hooks.tell_late(self, error)
        return None

    def _given_up_failure(self) -> Outcome | None:
        """The failure of an attempt given up at max_execution_timeout, once."""
        if not self.settling_if(Phase.GAVE_UP):
            return None
        return self._decided(Phase.GAVE_UP, self._max_execution_exceeded())

    def _decided(self, phase: Phase, error: BaseException | None) -> Outcome | None:
        suspended = self.ctx.suspended
        if suspended is not None and phase in (Phase.RETURNED, Phase.RAISED):
            phase, error = (
                Phase.RAISED,
                suspended,
            )  # a sleep or a wait ended it, whatever the handler did then
        ending = Ending(
            phase, error=error, cause=self.ctx.cause, stopping=self._hooks.stopping(), result=self.result
        )
        outcome = self.decide(ending)
        if outcome is None:
            # fenced, hung, or a durable call's outage (its claim may still be ours): the reaper's
            outage = _outage(self.ctx.cause)
            if outage:
                self._hooks.tell_outage(self, self.ctx.cause)
            self.let_go(unsettled=phase in (Phase.FENCED, Phase.HUNG) or outage)
            return None
        if phase is Phase.RAISED and error is not None:
            self._hooks.tell_failed(self, error, outcome)
        return outcome

    def decide(self, ending: Ending) -> Outcome | None:
        """The outcome *ending* earns this attempt (``outcome.decide``); no move."""
        return decide(
            id=self.id,
            claim_token=self.row.claim_token,
            topic=self.topic,
            attempt=self.claim.attempt,
            options=self.kind.options,
            ending=ending,
            rng=self._hooks.rng,
        )

    def _max_execution_exceeded(self) -> MaxExecutionExceeded:
        hard = self.kind.options.td("max_execution_timeout").total_seconds()
        return MaxExecutionExceeded(f"max_execution_timeout of {hard:g}s elapsed")


def _nothing(*_args: object) -> None:
    return None


class Hooks:
    """What an attempt's moves touch outside it, and its endings' log lines and counters; the engine
    wires one for all its attempts, the defaults serve a bare attempt."""

    def __init__(
        self,
        log: logging.Logger | None = None,
        metrics: Metrics | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.log = log or logging.getLogger("brooq_py.engine")
        self.metrics = metrics
        self.rng = rng
        self.stopping: Callable[[], bool] = lambda: False
        # The handler's code ended (``InFlight.end``): no longer running, its topic's room back.
        self.left_running: Callable[[Attempt], object] = _nothing
        # Nothing (more) is written for it (``InFlight.drop``): its claim is no longer reported on.
        self.let_go: Callable[[Attempt], object] = _nothing
        # ... its row still ours (hung, fenced): named dropped for the reaper (``InFlight.drop_claim``).
        self.drop_claim: Callable[[Attempt], object] = _nothing
        self.release_slot: Callable[[], None] = _nothing  # the engine's slots, from start()

    def _tell(self, level: int, a: Attempt, what: str, *args: object) -> None:
        self.log.log(level, "job id=%s topic=%s attempt=%d: " + what, a.id, a.topic, a.claim.attempt, *args)

    def _count(self, counter: str, a: Attempt) -> None:
        if self.metrics is not None:
            self.metrics.child(getattr(self.metrics, counter), a.topic).inc()

    def tell_lost(self, a: Attempt, cause: BaseException) -> None:
        if isinstance(cause, JobCanceledByOperator):
            # the operator's cancel is the job's outcome, not a lost lease (reaping, takeover, fencing)
            if self.metrics is not None:
                self.metrics.child(self.metrics.settled, a.topic, "canceled").inc()
            self._tell(
                logging.INFO, a, "canceled by an operator; cancelling the handler, nothing will be written"
            )
        else:
            self._count("lease_lost", a)
            self._tell(logging.WARNING, a, "lease lost; cancelling the handler, nothing will be written")

    def tell_outage(self, a: Attempt, cause: BaseException | None) -> None:
        self._count("lease_lost", a)
        self._tell(logging.WARNING, a, "%s; the reaper takes the job back", cause)

    def tell_fenced(self, a: Attempt, lease: float) -> None:
        self._count("lease_lost", a)
        what = "no heartbeat for %gs: fencing (cancelling the handler, nothing will be written)"
        self._tell(logging.ERROR, a, what, lease)

    def tell_gave_up(self, a: Attempt) -> None:
        what = (
            "still running after max_execution_timeout; freeing the slot; the failed attempt is "
            "recorded when the handler ends or is declared hung"
        )
        self._tell(logging.ERROR, a, what)

    def tell_hung(self, a: Attempt, grace: float) -> None:
        self._count("hung", a)
        what = "handler hung: still running %gs after its context was cancelled (%s); its claim is dropped for the reaper"
        self._tell(logging.ERROR, a, what, grace, type(a.ctx.cause).__name__)

    def tell_unstarted(self, a: Attempt, grace: float) -> None:
        what = "handler not started %gs after its context was cancelled (%s); handing the job back unrun"
        self._tell(logging.WARNING, a, what, grace, type(a.ctx.cause).__name__)

    def tell_late(self, a: Attempt, error: BaseException | None) -> None:
        how = "returned" if error is None else f"raised {describe_error(error)}"
        self._tell(
            logging.WARNING, a, "handler %s after the attempt ended (%s); nothing written", how, a.phase
        )

    def tell_failed(self, a: Attempt, error: BaseException, outcome: Outcome) -> None:
        then = what_then(outcome)  # the last attempt's failure says the job is now dead
        if any(
            find_signal(error, s) is not None
            for s in (MustCancelTask, MustDelay, MustPreserveAttempt, Snooze)
        ):
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


def unstarted(a: Attempt) -> BaseException | None:
    """Why *a*'s handler must not start, or None: its claim is no longer this engine's (fenced, lost,
    canceled by an operator: ``LeaseLost``) before the handler ran, or the attempt has an ending at
    all. An ending is recorded before its context is cancelled (it is told first, then cancelled):
    a start on another thread in between sees the ending, never a handler run for a claim let go.
    Any other cancel (a timeout, the engine stopping) is the handler's to see, as before."""
    cause = a.ctx.cause
    if isinstance(cause, LeaseLost):
        return cause
    ending = a.ending
    if ending is not None:
        return LeaseLost(f"the attempt ended ({ending}) before its handler started")
    return None


def _outage(cause: BaseException | None) -> bool:
    """Whether *cause* is a durable call's lost database (``Context._outage``)."""
    return isinstance(cause, LeaseLost) and isinstance(cause.__cause__, StoreUnavailable)

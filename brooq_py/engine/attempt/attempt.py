"""Attempt: one claimed job in this engine, as an explicit state machine (SPEC L1).

Two machines share one lock. ``phase`` is the attempt's ending::

    CLAIMED ──▶ RUNNING ──▶ RETURNED | RAISED | HUNG | LOST | GAVE_UP | FENCED
       │                               │
       └──▶ POISONED | UNRUN           └──▶ SETTLING ──▶ SETTLED

The first ending wins: a handler that returns after the watchdog called it hung
finds the attempt ended and writes nothing. ``handler`` is the life of the
handler's code (a thread or a task), which may outlive the attempt's ending:
RUNNING ──▶ ENDED, or ──▶ ABANDONED (the engine stopped waiting: slot freed) /
HUNG (counted, slot freed) and later ──▶ ENDED. Whoever moves the handler out of
RUNNING owns the slot's release. A move not in the tables raises
``IllegalTransition``: a bug, never a race.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from brooq_py.engine.attempt.phases import ENDINGS, HANDLER, PHASES, HandlerState, IllegalTransition, Phase
from brooq_py.engine.repo import ClaimedJob
from brooq_py.queue import Claim, Context, KindOptions, Lease

__all__ = ["ENDINGS", "HANDLER", "PHASES", "Attempt", "HandlerState", "IllegalTransition", "Kind", "Phase"]

HandlerCallable = Callable[[Context, Claim], Any]


@dataclass(frozen=True)
class Kind:
    """A registered topic: its handler (resolved to a callable) and options."""

    topic: str
    handler: HandlerCallable
    options: KindOptions
    is_async: bool

    @classmethod
    def build(cls, topic: str, handler: object, options: KindOptions) -> Kind:
        fn: Any = handler
        if not inspect.isroutine(handler) and callable(getattr(handler, "handle", None)):
            fn = handler.handle  # type: ignore[attr-defined]
        if not callable(fn):
            raise TypeError("handler must be a function, an async function or an object with .handle")
        is_async = inspect.iscoroutinefunction(fn) or (
            not inspect.isroutine(fn) and inspect.iscoroutinefunction(type(fn).__call__)
        )
        return cls(topic=topic, handler=fn, options=options, is_async=is_async)


class Attempt:
    """The engine's record of one claim while it is ours (see the module's tables)."""

    __slots__ = (
        "_ending",
        "_handler",
        "_lock",
        "_phase",
        "cancelled_at",
        "claim",
        "ctx",
        "hard_deadline",
        "kind",
        "renewed_at",
        "row",
        "soft_deadline",
        "started",
    )

    def __init__(self, row: ClaimedJob, kind: Kind, started: float, ctx: Context) -> None:
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
        )
        self.started = started
        # When the database last confirmed the lease (monotonic): the claim's return, then each renewal (L4).
        self.renewed_at = started
        self.soft_deadline = started + opts.td("attempt_timeout").total_seconds()
        self.hard_deadline = started + opts.td("max_execution_timeout").total_seconds()
        self.cancelled_at: float | None = None
        self._lock = threading.Lock()
        self._phase = Phase.CLAIMED
        self._ending: Phase | None = None
        self._handler = HandlerState.RUNNING

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
        """CLAIMED -> RUNNING: the handler is about to be called."""
        with self._lock:
            self._move(Phase.RUNNING)

    def end(self, ending: Phase) -> bool:
        """Record how the attempt ended; return False if another ending came first.

        From RUNNING (or CLAIMED for POISONED and UNRUN) only: the race between a
        handler's return and the watchdog or heartbeat is normal, and its loser
        learns it here. Raise ``IllegalTransition`` for a phase that is no ending.
        """
        if ending not in ENDINGS:
            raise IllegalTransition(f"attempt {self.id}: {ending} is not an ending")
        with self._lock:
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
        """*ending* -> SETTLING if the attempt is still there; False when someone else took it.

        A given-up attempt (GAVE_UP) is settled by whichever comes first, its handler's end
        or the hung verdict (C4'): both may ask, one wins.
        """
        with self._lock:
            if self._phase is not ending:
                return False
            self._phase = Phase.SETTLING
            return True

    def settled(self) -> None:
        """SETTLING -> SETTLED: the outcome was written, found not ours, or there is none to write."""
        with self._lock:
            self._move(Phase.SETTLED)

    def give_up(self, ending: Phase) -> bool:
        """End the attempt with *ending* and abandon its handler, in one move, only while the
        handler still runs; return whether it did. A handler that already returned (its settling
        still to come) ends the attempt itself: it was not still running (C4)."""
        with self._lock:
            if self._handler is not HandlerState.RUNNING or ending not in PHASES[self._phase]:
                return False
            self._phase = self._ending = ending
            self._handler = HandlerState.ABANDONED
            return True

    # --- the handler's life ------------------------------------------------

    def handler_to(self, to: HandlerState) -> HandlerState | None:
        """Move the handler's state; return the previous one, or None when the move is not allowed
        from where it is (a normal race: e.g. ended before the watchdog called it hung)."""
        with self._lock:
            was = self._handler
            if to not in HANDLER[was]:
                if to is HandlerState.ENDED:
                    raise IllegalTransition(f"attempt {self.id}: handler ended twice")
                return None
            self._handler = to
            return was


def is_awaitable(value: object) -> bool:
    return isinstance(value, Awaitable)
